"""A small filesystem for the full-disk tests (tests/faults/test_disk_full.py,
tests/storage/test_storage_quota.py): a tmpfs mounted on a folder, and a ballast file that
fills it to a given number of free bytes.

  small_tmpfs(folder, size_mb) -> context manager yielding `folder` with a tmpfs of
      `size_mb` MiB mounted on it (created if missing; unmounted on exit); skips the test,
      with the reason, where mounting is not permitted (CI runs as root)
  fill(folder, leave=0) -> Path   `folder/ballast` (replaced when there), sized to leave
      about `leave` bytes free on the folder's filesystem (`storage.space.free_bytes`)
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage.space import free_bytes


@contextmanager
def small_tmpfs(folder: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB on `folder` for the duration of the block (module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                           str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """A ballast file leaving about `leave` bytes free where `folder` is: written until that
    or until a write fails, then shrunk back if something else (a server's log) took some
    of the room meanwhile."""
    ballast = folder / "ballast"
    ballast.unlink(missing_ok=True)
    with ballast.open("wb", buffering=0) as f:
        size = max(0, free_bytes(folder) - leave)
        chunk = b"\0" * (1 << 20)
        try:
            while size > 0:
                size -= f.write(chunk[: min(size, len(chunk))])
        except OSError:
            pass
        short = leave - free_bytes(folder)
        if short > 0:
            f.truncate(max(0, f.tell() - short))
    return ballast
