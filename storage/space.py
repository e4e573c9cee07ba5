"""Disk space: what is free, what a full disk looks like as an exception, and a reserve file.

`SpaceReserve` keeps a file of real (allocated) blocks beside a store. When a write finds the
disk full, the store releases the reserve and retries once, so deletes and status writes
still commit on a full disk (and deleting frees space); the reserve is taken again once the
disk has room for it twice over.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it was raised from) means the disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        if isinstance(seen, sqlite3.OperationalError) and "full" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class SpaceReserve:
    """A file of `size` allocated bytes at `path` that can be given up when the disk fills.

    Thread-safe. `size` 0 keeps none. The file holds zeros and is never read.
    """

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._lock = threading.Lock()
        self.take()

    def take(self) -> bool:
        """Allocate the reserve if it is missing and the disk has room for it twice over;
        returns whether it is held now."""
        if self.size <= 0:
            return False
        with self._lock:
            if self.path.exists():
                return True
            try:
                if free_bytes(self.path.parent) < 2 * self.size:
                    return False
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                finally:
                    os.close(fd)
            except OSError as exc:
                self.path.unlink(missing_ok=True)
                log.warning("could not allocate the disk reserve %s: %s", self.path, exc)
                return False
            return True

    def release(self) -> bool:
        """Give the reserve's blocks back to the filesystem; returns whether one was held."""
        with self._lock:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return False
            log.warning("the disk is full: released the %d-byte reserve %s", self.size,
                        self.path)
            return True
