"""Disk tier: atomic files, corruption handling, LRU budget, restart, concurrent writers."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from storage.errors import InvalidKeyError
from storage.keys import PageHash
from storage.kv.disk import TMP_PREFIX, DiskKVStore
from tests.storage.kv_testkit import QWEN2VL_2B, assert_same_page, disk_writer, make_page


def _k(i: int) -> PageHash:
    return PageHash(f"{i:02x}" + "ab" * 31)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_bit_exact(tmp_path: Path, dtype: torch.dtype) -> None:
    page = make_page(1, QWEN2VL_2B, dtype)
    store = DiskKVStore(tmp_path, 1 << 30)
    store.put_many({_k(1): page})
    assert _files(tmp_path) == [tmp_path / "01" / f"{_k(1)}.safetensors"]
    assert_same_page(page, store.get_many([_k(1)])[_k(1)])
    s = store.stats()
    assert (s.hits, s.entries, s.bytes) == (1, 1, store.path(_k(1)).stat().st_size)
    assert store.get_many([_k(2)]) == {} and store.stats().misses == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_file_is_a_miss_and_removed(tmp_path: Path, damage: str) -> None:
    store = DiskKVStore(tmp_path, 1 << 30)
    store.put_many({_k(1): make_page(1), _k(2): make_page(2)})
    path = store.path(_k(1))
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[len(blob) // 2] ^= 0x40
    elif damage == "truncate":
        blob = blob[: len(blob) - 100]
    else:
        blob = bytearray()
    path.write_bytes(bytes(blob))
    assert list(store.get_many([_k(1), _k(2)])) == [_k(2)]
    assert not path.exists() and store.stats().corrupt == 1
    assert store.contains([_k(1), _k(2)]) == {_k(2)}


def _flip_in_place(path: Path, pos: int) -> None:
    """Change one byte of the file without replacing it (a bad disk or a stray writer)."""
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("where", [0.0, 0.3, 0.999])  # header, first data chunk, last chunk
def test_warm_read_of_a_file_changed_since_the_last_read_is_a_miss(tmp_path: Path,
                                                                    where: float) -> None:
    store = DiskKVStore(tmp_path, 1 << 30)
    page = make_page(3, (2048, 4, 2, 64, 128))  # several read chunks (READ_CHUNK)
    store.put_many({_k(3): page})
    path = store.path(_k(3))
    first = store.get_many([_k(3)])[_k(3)]  # the file is now in the page cache
    assert path.stat().st_size > 3 << 20
    _flip_in_place(path, 20 if where == 0.0 else int(path.stat().st_size * where))
    assert store.get_many([_k(3)]) == {}
    s = store.stats()
    assert (s.hits, s.misses, s.corrupt, s.entries) == (1, 1, 1, 0)
    assert not path.exists()
    assert_same_page(page, first)  # what the first read returned is not the file's memory


def test_a_batch_read_verifies_every_entry(tmp_path: Path) -> None:
    """In a batch, an entry changed after an earlier read (in the middle of the batch) is a
    miss and one deleted since is a miss; the others come back whole."""
    store = DiskKVStore(tmp_path, 1 << 30)
    pages = {_k(i): make_page(i, (1024, 4, 2, 64, 128)) for i in range(5)}
    store.put_many(pages)
    keys = list(pages)
    assert list(store.get_many(keys)) == keys  # warm: every file in the page cache
    _flip_in_place(store.path(keys[2]), store.path(keys[2]).stat().st_size // 2)
    store.path(keys[3]).unlink()  # gone between the index and the read
    got = store.get_many(keys)
    assert list(got) == [keys[0], keys[1], keys[4]]
    for key in got:
        assert_same_page(pages[key], got[key])
    s = store.stats()
    assert (s.hits, s.misses, s.corrupt) == (8, 2, 1)
    assert not store.path(keys[2]).exists()


def test_lru_eviction_under_budget(tmp_path: Path) -> None:
    pages = {_k(i): make_page(i) for i in range(4)}
    probe = DiskKVStore(tmp_path / "probe", 1 << 30)
    probe.put_many({_k(0): pages[_k(0)]})
    size = probe.stats().bytes
    store = DiskKVStore(tmp_path / "kv", 3 * size)
    store.put_many({k: pages[k] for k in (_k(0), _k(1), _k(2))})
    store.get_many([_k(0)])
    store.put_many({_k(3): pages[_k(3)]})
    assert store.contains(list(pages)) == {_k(0), _k(2), _k(3)}
    assert not store.path(_k(1)).exists()
    s = store.stats()
    assert s.evictions == 1 and s.bytes == 3 * size
    assert sum(p.stat().st_size for p in _files(tmp_path / "kv")) == 3 * size


def test_restart_rebuilds_index_and_cleans_stray_temp_files(tmp_path: Path) -> None:
    store = DiskKVStore(tmp_path, 1 << 30)
    pages = {_k(i): make_page(i) for i in range(3)}
    for k, p in pages.items():
        store.put_many({k: p})
        os.utime(store.path(k), (time.time() - 100 + int(k[:2], 16),) * 2)
    stray = tmp_path / "01" / f"{TMP_PREFIX}crashed"
    stray.write_bytes(b"half a page")
    fresh = tmp_path / "02" / f"{TMP_PREFIX}in-flight"
    fresh.write_bytes(b"another process is writing this")
    os.utime(stray, (time.time() - 3600,) * 2)
    size = store.stats().bytes // 3

    again = DiskKVStore(tmp_path, 1 << 30, stale_tmp_s=60)
    assert again.stats().entries == 3 and again.stats().bytes == 3 * size
    assert not stray.exists() and fresh.exists()
    got = again.get_many(list(pages))
    for k, p in pages.items():
        assert_same_page(p, got[k])

    smaller = DiskKVStore(tmp_path, 2 * size, stale_tmp_s=0)  # oldest (by mtime) goes first
    assert smaller.contains(list(pages)) == {_k(1), _k(2)} and not fresh.exists()


def test_files_written_by_another_process_are_found(tmp_path: Path) -> None:
    a, b = DiskKVStore(tmp_path, 1 << 30), DiskKVStore(tmp_path, 1 << 30)
    a.put_many({_k(1): make_page(1)})
    assert b.contains([_k(1)]) == {_k(1)}
    assert_same_page(make_page(1), b.get_many([_k(1)])[_k(1)])
    a.delete([_k(1)])
    assert b.get_many([_k(1)]) == {} and b.stats().entries == 0


def test_invalid_keys_are_rejected(tmp_path: Path) -> None:
    store = DiskKVStore(tmp_path, 1 << 30)
    with pytest.raises(InvalidKeyError):
        store.put_many({PageHash("../../escape"): make_page(1)})


def _assert_one_clean_copy(root: Path, key: PageHash, seed: int, shape: tuple[int, ...]) -> None:
    assert _files(root) == [root / key[:2] / f"{key}.safetensors"]  # no temp files left
    got = DiskKVStore(root, 1 << 34).get_many([key])
    assert_same_page(make_page(seed, shape), got[key])  # type: ignore[arg-type]


def test_concurrent_thread_writers_leave_one_whole_copy(tmp_path: Path) -> None:
    shape = (512, 8, 2, 64, 256)
    page = make_page(3, shape)
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def write() -> None:
        store = DiskKVStore(tmp_path, 1 << 34)  # each writer sees no file yet: all write
        barrier.wait()
        try:
            store.put_many({_k(3): page})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _assert_one_clean_copy(tmp_path, _k(3), 3, shape)


def test_concurrent_process_writers_leave_one_whole_copy(tmp_path: Path) -> None:
    shape = (512, 8, 2, 64, 256)
    page = make_page(4, shape)
    ctx = multiprocessing.get_context("fork")  # spawn would re-import torch per child
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=disk_writer, args=(str(tmp_path), _k(4), page, barrier, 5))
             for _ in range(3)]
    for p in procs:
        p.start()
    reader = DiskKVStore(tmp_path, 1 << 34)
    deadline = time.monotonic() + 120
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        got = reader.get_many([_k(4)])  # a concurrent reader never sees a torn file
        if got:
            assert_same_page(page, got[_k(4)])
        time.sleep(0.02)
    for p in procs:
        p.join(timeout=60)
        if p.exitcode is None:
            p.kill()
        assert p.exitcode == 0
    assert reader.stats().corrupt == 0
    _assert_one_clean_copy(tmp_path, _k(4), 4, shape)


def test_reads_are_private_mappings_that_outlive_the_file(tmp_path: Path) -> None:
    store = DiskKVStore(tmp_path, 1 << 30)
    page = make_page(7)
    store.put_many({_k(7): page})
    before = store.path(_k(7)).read_bytes()
    got = store.get_many([_k(7)])[_k(7)]
    got.keys.mul_(0)  # writable; copy-on-write, the file is untouched
    assert store.path(_k(7)).read_bytes() == before
    assert_same_page(page, store.get_many([_k(7)])[_k(7)])
    again = store.get_many([_k(7)])[_k(7)]
    store.delete([_k(7)])
    assert not store.path(_k(7)).exists()
    assert_same_page(page, again)  # still readable after its file is gone
