"""Redis tier: entries split per layer, pipelined, optional TTL, safe under eviction.

Keys of one entry share a hash tag (`{prefix}:{<hash>}:h` for the header, `...:<i>` for layer
value i) so a Redis Cluster keeps them in one slot. Each entry is written in its own
MULTI/EXEC (layers first, header last), entries batched into pipelines of about
`pipeline_bytes`. A read fetches all headers in one round trip, then the layer values in
pipelines of about `pipeline_bytes`: Redis counts client query and reply buffers as used memory,
so one huge pipeline under `maxmemory` would itself evict other entries. Under `maxmemory` with
an `allkeys-*` policy Redis may evict single values: an entry missing any value is a miss and
its remaining values are removed. An unreachable Redis (after a few retries with exponential
backoff) degrades every call to a miss or a skipped write, logged and counted, never raised.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from conduit_core.page_kv import PageKV
from storage.errors import CorruptEntryError
from storage.keys import PageHash
from storage.kv.base import Counters, TierStats
from storage.kv.split import (
    SplitEncoded,
    SplitHeader,
    decode_split,
    encode_split,
    read_header,
)

log = logging.getLogger(__name__)

T = TypeVar("T", bound=tuple[Any, ...])


def _value_bytes(header: SplitHeader) -> int:
    """Size of one layer value of the entry."""
    return math.prod(header.layer_shape) * header.layer_dtype.itemsize


def _get_all(pipe: Pipeline, names: Sequence[str]) -> None:
    for name in names:
        pipe.get(name)


def _chunks(items: list[T], max_bytes: int) -> Iterator[list[T]]:
    """Consecutive runs of `items` (sized by their last field) of about `max_bytes` each."""
    run: list[T] = []
    size = 0
    for item in items:
        if run and size + item[-1] > max_bytes:
            yield run
            run, size = [], 0
        run.append(item)
        size += item[-1]
    if run:
        yield run


class RedisKVStore:
    """Page KV in Redis at `url` (`redis://` or `rediss://`, password and db in the URL)."""

    def __init__(self, url: str, *, ttl_s: int | None = None, prefix: str = "conduit:kv",
                 quantize: bool = False, attempts: int = 3, socket_timeout_s: float = 120.0,
                 connect_timeout_s: float = 2.0, pipeline_bytes: int = 64 << 20) -> None:
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError("ttl_s must be positive or None")
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.quantize = quantize
        self.pipeline_bytes = pipeline_bytes
        # 1 MB socket reads: bulk layer values arrive in far fewer recv calls than with the
        # 64 KB default
        self._client = redis.Redis.from_url(
            url, retry=Retry(NoBackoff(), 0), socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s, socket_read_size=1 << 20)
        self._retrying = Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception_type((redis.ConnectionError, redis.TimeoutError)),
            reraise=True,
        )
        self._counters = Counters()

    def _header_key(self, key: PageHash) -> str:
        return f"{self.prefix}:{{{key}}}:h"

    def _layer_keys(self, key: PageHash, n_values: int) -> list[str]:
        return [f"{self.prefix}:{{{key}}}:{i}" for i in range(n_values)]

    def _pipeline(self, build: Callable[[Pipeline], object]) -> list[Any]:
        """Run one non-transactional pipeline, retrying connection failures with backoff."""
        def attempt() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            build(pipe)
            return pipe.execute()
        result: list[Any] = self._retrying(attempt)
        return result

    def get_many(self, keys: Sequence[PageHash]) -> dict[PageHash, PageKV]:
        """Headers in one round trip, then layer values in bounded pipelines; partial, corrupt
        or unreachable entries are misses."""
        keys = list(dict.fromkeys(keys))
        found: dict[PageHash, PageKV] = {}
        try:
            raw = self._pipeline(lambda p: [p.get(self._header_key(k)) for k in keys])
        except redis.RedisError as exc:
            return self._unavailable("read", exc, misses=len(keys))
        headers: dict[PageHash, SplitHeader] = {}
        broken: dict[PageHash, int | None] = {}  # entry -> value count (None: unknown)
        corrupt = 0
        for key, value in zip(keys, raw, strict=True):
            if value is None:
                continue
            try:
                headers[key] = read_header(value)
            except CorruptEntryError as exc:
                log.warning("corrupt Redis KV header %s (%s): removed, a miss", key, exc)
                broken[key] = None
                corrupt += 1
        if headers:
            try:
                values = self._get_layers(headers)
            except redis.RedisError as exc:
                return self._unavailable("read", exc, misses=len(keys))
            for key, header in headers.items():
                parts = values[key]
                try:
                    found[key] = decode_split(header, parts)
                except CorruptEntryError as exc:
                    partial = any(v is None for v in parts)
                    corrupt += 0 if partial else 1
                    log.info("Redis KV entry %s is %s (%s): removed, a miss", key,
                             "partially evicted" if partial else "corrupt", exc)
                    broken[key] = header.n_values
        self._counters.add(hits=len(found), misses=len(keys) - len(found), corrupt=corrupt)
        if broken:
            self._remove(broken)
        return found

    def _get_layers(self, headers: Mapping[PageHash, SplitHeader]
                    ) -> dict[PageHash, list[Any]]:
        """All layer values of the entries, in pipelines of about `pipeline_bytes`."""
        names = [(k, name, _value_bytes(h)) for k, h in headers.items()
                 for name in self._layer_keys(k, h.n_values)]
        out: dict[PageHash, list[Any]] = {k: [] for k in headers}
        for chunk in _chunks(names, self.pipeline_bytes):
            got = self._pipeline(partial(_get_all, names=[name for _, name, _ in chunk]))
            for (key, _, _), value in zip(chunk, got, strict=True):
                out[key].append(value)
        return out

    def _unavailable(self, what: str, exc: Exception, *, misses: int = 0
                     ) -> dict[PageHash, PageKV]:
        log.warning("Redis KV tier unavailable for %s (%s: %s); treated as a miss", what,
                    type(exc).__name__, exc)
        self._counters.add(misses=misses, errors=1)
        return {}

    def _remove(self, entries: Mapping[PageHash, int | None]) -> None:
        """Delete entries; `None` = value count unknown (corrupt header): scan for them."""
        names: list[str] = []
        try:
            for key, n in entries.items():
                names.append(self._header_key(key))
                if n is None:
                    names.extend(self._client.scan_iter(match=f"{self.prefix}:{{{key}}}:*",
                                                        count=1000))
                else:
                    names.extend(self._layer_keys(key, n))
            if names:
                self._pipeline(lambda p: p.unlink(*names))
        except redis.RedisError as exc:
            self._unavailable("delete", exc)

    def put_many(self, items: Mapping[PageHash, PageKV]) -> None:
        """Write each entry atomically (MULTI/EXEC), all in one pipeline."""
        if not items:
            return
        encoded = {k: encode_split(page, quantize=self.quantize) for k, page in items.items()}
        ex: tuple[Any, ...] = ("EX", self.ttl_s) if self.ttl_s else ()

        def build(p: Pipeline, batch: list[tuple[PageHash, SplitEncoded, int]]) -> None:
            for key, enc, _ in batch:
                p.execute_command("MULTI")
                for name, value in zip(self._layer_keys(key, len(enc.layers)), enc.layers,
                                       strict=True):
                    p.execute_command("SET", name, value, *ex)
                p.execute_command("SET", self._header_key(key), enc.header, *ex)
                p.execute_command("EXEC")
        entries = [(k, enc, enc.nbytes) for k, enc in encoded.items()]
        try:
            for batch in _chunks(entries, self.pipeline_bytes):
                self._pipeline(partial(build, batch=batch))
        except redis.RedisError as exc:
            self._unavailable("write", exc)

    def contains(self, keys: Sequence[PageHash]) -> set[PageHash]:
        """Keys whose header exists (their layers may still have been evicted)."""
        keys = list(keys)
        try:
            flags = self._pipeline(lambda p: [p.exists(self._header_key(k)) for k in keys])
        except redis.RedisError as exc:
            self._unavailable("contains", exc)
            return set()
        return {k for k, f in zip(keys, flags, strict=True) if f}

    def delete(self, keys: Iterable[PageHash]) -> None:
        """Remove entries (header and every layer value)."""
        keys = list(keys)
        if not keys:
            return
        try:
            raw = self._pipeline(lambda p: [p.get(self._header_key(k)) for k in keys])
        except redis.RedisError as exc:
            self._unavailable("delete", exc)
            return
        entries: dict[PageHash, int | None] = {}
        for key, value in zip(keys, raw, strict=True):
            if value is None:
                continue  # no entry (values orphaned by an evicted header age out by LRU/TTL)
            try:
                entries[key] = read_header(value).n_values
            except CorruptEntryError:
                entries[key] = None
        self._remove(entries)

    def stats(self) -> TierStats:
        """Counters and the server's `used_memory` (0 if Redis is unreachable), in O(1): no
        scan, so a metrics scrape costs the same whatever Redis holds. `entries` is -1 (not
        counted)."""
        try:
            used = int(self._client.info("memory")["used_memory"])
        except redis.RedisError as exc:
            log.warning("Redis KV stats unavailable: %s", exc)
            used = 0
        return self._counters.snapshot(bytes_=used, entries=-1)

    def close(self) -> None:
        """Release connections."""
        self._client.close()
