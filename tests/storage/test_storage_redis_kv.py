"""Redis tier against real servers: round trips, eviction, restarts, corruption, TLS, auth."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
import torch

from lab.processes import free_port, start_redis
from storage.keys import PageHash
from storage.kv.redis_store import RedisKVStore
from tests.storage.kv_testkit import QWEN2VL_2B, SMALL, assert_same_page, make_page, redis_entries


def _k(i: int) -> PageHash:
    return PageHash(f"{i:02x}" + "cd" * 31)


def _raw(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_bit_exact_split_per_layer(redis_url: str, prefix: str,
                                              dtype: torch.dtype) -> None:
    page = make_page(1, QWEN2VL_2B, dtype)
    store = RedisKVStore(redis_url, prefix=prefix)
    store.put_many({_k(1): page, _k(2): make_page(2)})
    got = store.get_many([_k(1), _k(2), _k(3)])
    assert set(got) == {_k(1), _k(2)}
    assert_same_page(page, got[_k(1)])
    raw = _raw(redis_url)
    names = list(raw.scan_iter(match=f"{prefix}:{{{_k(1)}}}:*"))
    assert len(names) == 1 + 2 * page.keys.shape[0]
    layer_bytes = page.keys[0].numel() * page.keys.element_size()
    assert max(raw.strlen(n) for n in names if not n.endswith(b":h")) == layer_bytes
    header = raw.strlen(f"{prefix}:{{{_k(1)}}}:h")  # embeddings + small tensors + metadata
    assert header < page.embeds.numel() * page.embeds.element_size() + 64 * 1024
    assert store.contains([_k(1), _k(3)]) == {_k(1)}
    s = store.stats()
    assert (s.hits, s.misses, s.entries) == (2, 1, -1) and s.bytes > page.nbytes
    assert redis_entries(redis_url, prefix) == 2  # stats never scan: metrics stay O(1)
    store.delete([_k(1), _k(3)])
    assert list(raw.scan_iter(match=f"{prefix}:{{{_k(1)}}}:*")) == []
    assert store.get_many([_k(1)]) == {}


def test_int8_and_ttl(redis_url: str, prefix: str) -> None:
    page = make_page(3, SMALL, torch.float32)
    store = RedisKVStore(redis_url, prefix=prefix, ttl_s=600, quantize=True)
    store.put_many({_k(3): page})
    raw = _raw(redis_url)
    ttls = [raw.ttl(n) for n in raw.scan_iter(match=f"{prefix}:*")]
    assert ttls and all(0 < t <= 600 for t in ttls)
    got = store.get_many([_k(3)])[_k(3)].dequantized()
    step = page.keys.abs().amax(dim=2, keepdim=True) / 127
    assert ((got.keys - page.keys).abs() <= step / 2 * 1.0001).all()
    assert torch.equal(got.embeds, page.embeds)


def test_corrupt_partial_and_mixed_entries_miss_and_are_removed(redis_url: str,
                                                                 prefix: str) -> None:
    store = RedisKVStore(redis_url, prefix=prefix)
    pages = {_k(i): make_page(i) for i in range(5)}
    store.put_many(pages)
    raw = _raw(redis_url)
    raw.setrange(f"{prefix}:{{{_k(0)}}}:h", 200, b"\x00\x01")  # header bytes flipped
    raw.setrange(f"{prefix}:{{{_k(1)}}}:3", 5, b"\xff")  # a layer value flipped
    raw.delete(f"{prefix}:{{{_k(2)}}}:4")  # one value evicted
    raw.copy(f"{prefix}:{{{_k(4)}}}:2", f"{prefix}:{{{_k(3)}}}:2", replace=True)  # a mix
    got = store.get_many(list(pages))
    assert set(got) == {_k(4)}
    assert_same_page(pages[_k(4)], got[_k(4)])
    for i in range(4):
        assert list(raw.scan_iter(match=f"{prefix}:{{{_k(i)}}}:*")) == [], i
    s = store.stats()
    assert s.corrupt == 3 and s.misses == 4  # the evicted value is a miss, not corruption


def test_maxmemory_eviction_never_yields_a_partial_entry(tmp_path: Path) -> None:
    url, stop = start_redis(tmp_path, args=["--maxmemory", "12mb",
                                            "--maxmemory-policy", "allkeys-lru"])
    try:
        shape = (128, 8, 2, 64, 128)  # about 0.8 MB of bf16 KV per page
        pages = {_k(i): make_page(i, shape) for i in range(40)}
        # small pipelines, as in production where pipeline_bytes << maxmemory
        store = RedisKVStore(url, pipeline_bytes=256 * 1024)
        for key, page in pages.items():
            if key == _k(39):
                time.sleep(1.1)  # Redis' LRU clock ticks once a second: make it the newest
            store.put_many({key: page})
        raw = _raw(url)
        layers = 2 * shape[1]
        partial = {k for k in pages if raw.exists(f"conduit:kv:{{{k}}}:h") and raw.exists(
            *[f"conduit:kv:{{{k}}}:{i}" for i in range(layers)]) < layers}
        got = store.get_many(list(pages))
        assert partial and _k(39) in got and len(got) < len(pages)
        assert not partial & set(got)
        for key, page in got.items():
            assert_same_page(page, pages[key])
        for key in partial:  # removed by the read (or its header evicted meanwhile)
            assert not raw.exists(f"conduit:kv:{{{key}}}:h")
    finally:
        stop()


def test_restart_between_put_and_get_is_a_clean_miss(tmp_path: Path) -> None:
    port = free_port()
    url, stop = start_redis(tmp_path, port=port)
    store = RedisKVStore(url, attempts=2)
    page = make_page(1)
    store.put_many({_k(1): page})
    stop()
    assert store.get_many([_k(1)]) == {}  # down: a miss, no exception
    store.put_many({_k(2): page})  # down: the write is skipped, no exception
    assert store.contains([_k(1)]) == set()
    store.delete([_k(1)])
    assert store.stats().errors >= 4
    url2, stop2 = start_redis(tmp_path, port=port)
    try:
        assert url2 == url
        assert store.get_many([_k(1)]) == {}  # restarted without persistence: a miss
        store.put_many({_k(1): page})  # the pool reconnects by itself
        assert_same_page(page, store.get_many([_k(1)])[_k(1)])
    finally:
        stop2()


def test_password_in_url(tmp_path: Path) -> None:
    url, stop = start_redis(tmp_path, password="s3cret-pw")
    try:
        assert "s3cret-pw@" in url
        store = RedisKVStore(url)
        store.put_many({_k(1): make_page(1)})
        assert set(store.get_many([_k(1)])) == {_k(1)}
        wrong = RedisKVStore(url.replace("s3cret-pw", "wrong"), attempts=1)
        assert wrong.get_many([_k(1)]) == {} and wrong.stats().errors >= 1
    finally:
        stop()


def _make_certs(d: Path) -> None:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "1", "-subj", "/CN=conduit-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "ext")


def test_tls_url(tmp_path: Path) -> None:
    _make_certs(tmp_path)
    tls_port = free_port()
    ca = tmp_path / "ca.crt"
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={ca}"
    _, stop = start_redis(tmp_path, url=url, args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(tmp_path / "server.crt"),
        "--tls-key-file", str(tmp_path / "server.key"), "--tls-ca-cert-file", str(ca),
        "--tls-auth-clients", "no"])
    try:
        store = RedisKVStore(url)
        page = make_page(1)
        store.put_many({_k(1): page})
        assert_same_page(page, store.get_many([_k(1)])[_k(1)])
        untrusted = RedisKVStore(f"rediss://127.0.0.1:{tls_port}/0", attempts=1)
        assert untrusted.get_many([_k(1)]) == {}  # the server's CA is not trusted: a miss
    finally:
        stop()


def test_stats_never_scan_the_keyspace(redis_url: str, prefix: str) -> None:
    """A metrics scrape reads the Redis tier's stats: they must cost O(1), not a SCAN."""
    store = RedisKVStore(redis_url, prefix=prefix)
    store.put_many({_k(i): make_page(i) for i in range(5)})
    raw = _raw(redis_url)

    def scans() -> int:
        return int(raw.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))

    before = scans()
    for _ in range(3):
        assert store.stats().bytes > 0
    assert scans() == before
    assert redis_entries(redis_url, prefix) == 5 and scans() > before
    store.close()
