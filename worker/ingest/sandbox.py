"""Read PDF pages in child processes under a memory cap and a hard time limit.

A 2 MB upload can hold a page whose content decompresses to gigabytes, and MuPDF holds a
page's whole content in memory while drawing it. So pages are never drawn or read in the
service's (or worker's) own process: a `PageReader` is a child process
(`worker.ingest.reader_child`) that caps its address space with RLIMIT_AS and answers one
page at a time; a page that takes longer than the time limit gets the child killed. Either
way the page's `PageLimitError` names the limit. Children are started with `subprocess`
(not `multiprocessing`), so a daemonic process such as a prefork Celery child can start them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from worker.ingest.errors import (
    IngestError,
    PageMemoryLimitError,
    PageTimeLimitError,
    ReaderStartError,
)
from worker.ingest.frames import ReaderGone, ReaderTimeout, read_frame_fd, write_frame
from worker.ingest.text import PageText, TextPolicy

log = logging.getLogger(__name__)
# What MuPDF, Tesseract and Leptonica wrote to stderr in the readers (debug level).
native_log = logging.getLogger("worker.ingest.native")

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# PyMuPDF imports its layout-analysis add-on when installed (2.5 s of a 4 s start here);
# readers never use it, so it is kept out of them.
_CHILD = ("import sys; sys.modules['pymupdf.layout'] = None; "
          "from worker.ingest.reader_child import main; sys.exit(main(sys.argv[1:]))")
# Starting Python and importing PyMuPDF takes about a second, and took over a minute on this
# 2-core machine at a load average of 17.
_START_SECONDS = 300.0


@dataclass(frozen=True)
class ReaderLimits:
    """Limits of one page reader process: its address space and the time for one page."""

    memory_mb: int = 2048
    page_seconds: float = 300.0


@dataclass
class PageResult:
    """One page as read by a reader: image (None when not rendered), text, page size in
    points; or `error` (why the page cannot be read) with everything else empty."""

    index: int
    image: Image.Image | None = None
    text: PageText = PageText(text="", source="none")
    width_pt: float = 0.0
    height_pt: float = 0.0
    error: str | None = None


def _widen_pipe(pipe: Any) -> None:
    """Grow the pipe's buffer to 1 MiB (Linux), so a page image crosses it in a few reads."""
    try:
        fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, 1 << 20)
    except (OSError, AttributeError):  # not Linux, or above /proc/sys/fs/pipe-max-size
        pass


class PageReader:
    """One reader process holding one document. Not thread-safe: one request at a time."""

    def __init__(self, data: bytes, *, password: str | None, limits: ReaderLimits) -> None:
        self.limits = limits
        self._closing = False
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        env = {**os.environ, "OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "1",
               "MALLOC_ARENA_MAX": "2",
               "PYTHONPATH": os.pathsep.join(
                   p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(limits.memory_mb * 2**20)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
            close_fds=True)
        _widen_pipe(self._proc.stdout)
        try:
            reply, _ = self._call({"op": "open", "password": password}, data, _START_SECONDS,
                                  page=0)
        except PageTimeLimitError:
            self.close()
            raise ReaderStartError(_START_SECONDS) from None
        except BaseException:
            self.close()
            raise
        if not reply["ok"]:
            self.close()
            raise IngestError(str(reply["reason"]))
        self.page_count = int(reply["pages"])

    def read(self, index: int, *, render: bool, dpi: int, max_pixels: int, ocr: bool,
             policy: TextPolicy) -> PageResult:
        """Read page `index` (0-based). A damaged page comes back with `error` set; a page
        past a limit raises `PageMemoryLimitError` or `PageTimeLimitError` (the reader is
        then dead: close it)."""
        request = {"op": "page", "index": index, "render": render, "dpi": dpi,
                   "max_pixels": max_pixels, "ocr": ocr, "policy": asdict(policy)}
        reply, pixels = self._call(request, b"", self.limits.page_seconds, page=index + 1)
        if not reply["ok"]:
            if reply.get("kind") == "memory":
                self.close()
                raise PageMemoryLimitError(index + 1, self.limits.memory_mb, reply["reason"])
            return PageResult(index=index, error=str(reply["reason"]))
        image = None
        if render:
            image = Image.frombytes("RGB", tuple(reply["size"]), pixels)
        return PageResult(index=index, image=image,
                          text=PageText(text=reply["text"], source=reply["source"]),
                          width_pt=float(reply["width"]), height_pt=float(reply["height"]))

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._proc.poll() is None

    def _call(self, header: dict[str, Any], blob: bytes, seconds: float,
              page: int) -> tuple[dict[str, Any], bytes]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            write_frame(self._proc.stdin, header, blob)
            reply, payload = read_frame_fd(self._proc.stdout.fileno(),
                                           time.monotonic() + seconds)
        except ReaderTimeout:
            self.close()
            raise PageTimeLimitError(page, seconds) from None
        except ReaderGone:
            if self._closing:  # stopped by close(): not the page's doing
                raise
            status = self._proc.wait()
            self._log_stderr_tail(logging.WARNING)
            self.close()
            how = f"signal {-status}" if status < 0 else f"status {status}"
            raise PageMemoryLimitError(page, self.limits.memory_mb,
                                       f"the reader process ended with {how}") from None
        if reply.get("log"):
            native_log.debug("page %d: %s", page, reply["log"].rstrip())
        return reply, payload

    def _log_stderr_tail(self, level: int) -> None:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 2000))
            tail = self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return
        if tail:
            log.log(level, "page reader's last output: %s", tail)

    def close(self) -> None:
        """Stop the process (at once: it holds nothing worth saving) and free its pipes."""
        self._closing = True
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:  # a broken pipe while flushing: nothing left to send
                    pass
        self._stderr.close()

    def __enter__(self) -> PageReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
