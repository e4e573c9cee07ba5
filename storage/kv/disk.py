"""Disk tier: one safetensors file per entry, atomic writes, LRU eviction under a byte budget.

Layout: `root/<first two hex digits>/<page hash>.safetensors`. A write goes to a temp file in
the same directory, is fsynced and renamed over the final name (`os.replace`), so a reader
sees either no file or a whole one, and concurrent writers of one page (threads or processes)
leave one complete copy. The LRU index (size and recency per entry) lives in memory; it is
rebuilt from the files at startup (recency from mtime), when stray temp files left by a crash
are removed. Several processes may share a root: each reads files the others wrote and
enforces the budget on what it knows of.

A read copies the file into a private, uninitialised buffer in 512 KB reads, hashing each while
it is still in the CPU cache, and returns tensors viewing the buffer (no second copy: the
kernel's copy is the only pass over memory). The file is never mapped: a shared or
copy-on-write mapping shows later changes of the file (bytes flipped on disk after a load
changed the next answer while the memory tier held the mapped tensors), so the bytes served
are exactly the bytes that were verified, whatever happens to the file afterwards. The
buffer is the runtime's staging memory (`conduit_core.kv.staging.host_buffer`, page-locked
where CUDA is available), so the page crosses to the device from it as it is.

The entries of one `get_many` (a question's pages) are read in parallel by up to
`read_threads` pool threads, each file into its own buffer: reads release the interpreter
lock, so the files' copies (and the device's queue of reads) overlap. What each call returns,
counts and removes is the same as reading them one by one.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conduit_core.page_kv import PageKV
from storage.errors import CorruptEntryError, InvalidKeyError
from storage.keys import PageHash, check_page_hash
from storage.kv.base import Counters, TierStats
from storage.kv.codec import Encoded, encode_page, read_page

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"
READ_THREADS = 4  # files of one get_many read at once (lab/store/NOTES.md)

_Read = tuple[PageKV | None, int, BaseException | None]  # page, file size, what went wrong


class DiskKVStore:
    """Page KV files under `root`, at most `max_bytes` of them (least recently used go first).

    `quantize` stores int8 keys/values. Each file's data is fsynced before the rename, so
    after a power loss a name never points at incomplete data; the directory is not fsynced,
    so the newest entries may be missing after one (a miss: this is a cache). `fsync=False`
    skips the data fsync too (still atomic against a crash of the process, not of the
    machine). Temp files untouched for `stale_tmp_s` are removed at startup as crash leftovers.
    `read_threads` files of one `get_many` are read at once (1: one after another).
    """

    def __init__(self, root: Path, max_bytes: int, *, quantize: bool = False,
                 fsync: bool = True, stale_tmp_s: float = 300.0,
                 read_threads: int = READ_THREADS) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if read_threads < 1:
            raise ValueError("read_threads must be >= 1")
        self.read_threads = read_threads
        self._pool: ThreadPoolExecutor | None = None
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.quantize = quantize
        self.fsync = fsync
        self._index: OrderedDict[PageHash, int] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._counters = Counters()
        self.root.mkdir(parents=True, exist_ok=True)
        self._rebuild(stale_tmp_s)

    def path(self, key: PageHash) -> Path:
        """Where the entry for `key` lives."""
        key = check_page_hash(key)
        return self.root / key[:2] / f"{key}{SUFFIX}"

    # -- index ----------------------------------------------------------------------------
    def _rebuild(self, stale_tmp_s: float) -> None:
        found: list[tuple[float, PageHash, int]] = []
        now = time.time()
        for shard in self.root.iterdir():
            if not shard.is_dir() or len(shard.name) != 2:
                continue
            for f in shard.iterdir():
                try:
                    st = f.stat()
                    if f.name.startswith(TMP_PREFIX):
                        if now - st.st_mtime >= stale_tmp_s:
                            f.unlink(missing_ok=True)
                            log.info("removed stray temp file %s", f)
                        continue
                    if f.name.endswith(SUFFIX):
                        key = check_page_hash(f.name[: -len(SUFFIX)])
                        found.append((st.st_mtime, key, st.st_size))
                except (OSError, InvalidKeyError):
                    continue
        found.sort()
        with self._lock:
            for _, key, size in found:
                self._index[key] = size
                self._bytes += size
        victims = self._select_victims(keep=None)
        self._remove_files(victims)
        log.info("disk KV tier at %s: %d entries, %d bytes", self.root, len(self._index),
                 self._bytes)

    def _track(self, key: PageHash, size: int) -> list[PageHash]:
        """Mark `key` (of `size` bytes) most recently used; return victims to unlink."""
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._bytes -= old
            self._index[key] = size
            self._bytes += size
        return self._select_victims(keep=key)

    def _forget(self, key: PageHash) -> None:
        with self._lock:
            old = self._index.pop(key, None)
            if old is not None:
                self._bytes -= old

    def _select_victims(self, keep: PageHash | None) -> list[PageHash]:
        victims: list[PageHash] = []
        with self._lock:
            if self._bytes <= self.max_bytes:  # the common case: no copy of the index
                return victims
            for key in list(self._index):
                if self._bytes <= self.max_bytes:
                    break
                if key == keep:
                    continue
                self._bytes -= self._index.pop(key)
                victims.append(key)
        return victims

    def _remove_files(self, victims: list[PageHash]) -> None:
        for key in victims:
            try:
                self.path(key).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not evict %s: %s", key, exc)
        self._counters.add(evictions=len(victims))

    # -- I/O --------------------------------------------------------------------------------
    def _load(self, path: Path) -> tuple[PageKV, int]:
        """Read the whole file into a private buffer, verifying it as it lands (`read_page`)."""
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            return read_page(f.readinto, size), size

    def _read(self, path: Path) -> _Read:
        """`_load`, with what went wrong returned rather than raised (for a pool thread)."""
        try:
            page, size = self._load(path)
        except (OSError, CorruptEntryError) as exc:  # FileNotFoundError included
            return None, 0, exc
        return page, size, None

    def _read_all(self, paths: list[Path]) -> list[_Read]:
        """`_read` of every path, in order: on the pool when there are several."""
        if self.read_threads == 1 or len(paths) < 2:
            return [self._read(p) for p in paths]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.read_threads,
                                                thread_name_prefix="conduit-disk-read")
            pool = self._pool
        return list(pool.map(self._read, paths))

    def _write(self, path: Path, enc: Encoded) -> None:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
        try:
            for part in enc.parts:
                view = memoryview(part).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)

    # -- KVStore ----------------------------------------------------------------------------
    def get_many(self, keys: Sequence[PageHash]) -> dict[PageHash, PageKV]:
        """Read and verify entries; corrupt files are removed and count as misses."""
        found: dict[PageHash, PageKV] = {}
        corrupt = errors = 0
        paths = [self.path(key) for key in keys]
        for key, path, (page, size, exc) in zip(keys, paths, self._read_all(paths),
                                                strict=True):
            if isinstance(exc, FileNotFoundError):
                self._forget(key)
                continue
            if isinstance(exc, CorruptEntryError):
                log.warning("corrupt disk KV entry %s (%s): removed, treated as a miss", key, exc)
                corrupt += 1
                self._forget(key)
                path.unlink(missing_ok=True)
                continue
            if exc is not None or page is None:
                log.warning("disk KV read of %s failed: %s", key, exc)
                errors += 1
                continue
            found[key] = page
            self._remove_files(self._track(key, size))
        self._counters.add(hits=len(found), misses=len(keys) - len(found), corrupt=corrupt,
                           errors=errors)
        return found

    def put_many(self, items: Mapping[PageHash, PageKV]) -> None:
        """Write entries not already on disk; failures are logged and counted, not raised."""
        errors = 0
        for key, page in items.items():
            path = self.path(key)
            try:
                if path.exists():
                    self._remove_files(self._track(key, path.stat().st_size))
                    continue
                enc = encode_page(page, quantize=self.quantize)
                if enc.nbytes > self.max_bytes:
                    log.debug("page %s (%d bytes) exceeds the disk budget", key, enc.nbytes)
                    continue
                self._write(path, enc)
            except FileNotFoundError:
                continue  # evicted or deleted by another process between the check and stat
            except OSError as exc:
                log.warning("disk KV write of %s failed: %s", key, exc)
                errors += 1
                continue
            self._remove_files(self._track(key, enc.nbytes))
        self._counters.add(errors=errors)

    def contains(self, keys: Sequence[PageHash]) -> set[PageHash]:
        """Keys with a file on disk."""
        with self._lock:
            known = {k for k in keys if k in self._index}
        return known | {k for k in keys if k not in known and self.path(k).exists()}

    def delete(self, keys: Iterable[PageHash]) -> None:
        """Remove entries' files."""
        for key in keys:
            self._forget(key)
            self.path(key).unlink(missing_ok=True)

    def stats(self) -> TierStats:
        """Counters and the size of the entries this process knows of."""
        with self._lock:
            size, n = self._bytes, len(self._index)
        return self._counters.snapshot(bytes_=size, entries=n)
