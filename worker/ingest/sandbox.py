"""Parse untrusted PDFs only in confined child processes, under memory, CPU and time limits.

A 2 MB upload can hold a page whose content decompresses to gigabytes, and a 300 KB one an
object stream (holding the page tree) that MuPDF inflates and holds whole at open: 600 MB.
So a PDF is never opened, drawn or read in the service's (or worker's) own process: a
`PageReader` is a child process (`worker.ingest.reader_child`) that gets a minimal
environment (no key, password or URL; `confine.child_env`), confines itself
(`confine.confine`: address space, file size, CPU time per request, no network, read access
to system and Python files only), opens the document it receives over a pipe, reports its
facts (`PdfFacts`), and answers one page at a time. `inspect_pdf` is the same child used
for the upload check: it opens, reports and, for an encrypted file, returns the decrypted
bytes. A page or an open that takes longer than its limit gets the child killed. Either way
the `IngestError` names the limit. Children are forked by a fork server
(`worker.ingest.fork_server`: a process that imported PyMuPDF once, started with
`subprocess`, not `multiprocessing`, so a daemonic process such as a prefork Celery child can
start it), or started with `subprocess` where none can run.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from PIL import Image

from worker.ingest.budget import READER_BUDGET, Reservation
from worker.ingest.confine import child_env
from worker.ingest.errors import (
    OpenMemoryLimitError,
    OpenTimeLimitError,
    PageMemoryLimitError,
    PageTimeLimitError,
    ReaderStartError,
    rebuild_error,
)
from worker.ingest.fork_server import READER_PREAMBLE, ForkedReader, start_reader
from worker.ingest.frames import ReaderGone, ReaderTimeout, read_frame_fd, write_frame
from worker.ingest.ocr import find_tessdata
from worker.ingest.text import PageText, TextPolicy

log = logging.getLogger(__name__)
# What MuPDF, Tesseract and Leptonica wrote to stderr in the readers (debug level).
native_log = logging.getLogger("worker.ingest.native")

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_CHILD = READER_PREAMBLE + ("from worker.ingest.reader_child import main; "
                            "sys.exit(main(sys.argv[1:]))")
# How long a reader may take to start (Python and PyMuPDF's imports): generous, because a
# heavily loaded machine stretches a start far beyond its usual time.
_START_SECONDS = 300.0


@dataclass(frozen=True)
class ReaderLimits:
    """Limits of one reader process: its address space, the time for one page or for the
    open (wall clock, and as much CPU time), the largest file it may write (its log), and the
    size of the process-wide budget its address space counts against."""

    memory_mb: int = 2048
    page_seconds: float = 300.0
    file_mb: int = 64
    budget_mb: int = 0  # the process's reader budget that `memory_mb` is reserved from
    # before the reader starts (`worker.ingest.budget`); 0 = this reader reserves nothing


@dataclass(frozen=True)
class PdfFacts:
    """What a reader found when it opened a document: its page count, title (None when it
    has none or it cannot be read), whether it looks truncated (`pdf.looks_truncated`), and
    the confinement the reader applied to itself (`confine.confine`'s report)."""

    page_count: int
    title: str | None
    truncated: bool
    confinement: str


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


# What `confine.confine` applies on a Linux kernel with every layer (6.12+, x86-64 or AArch64)
_FULL_CONFINEMENT = ("netns", "landlock-fs", "landlock-tcp", "landlock-scope", "seccomp")
_warned: set[str] = set()


def _warn_if_weak(confinement: str) -> None:
    """Log once per process, as a warning, the confinement layers a reader could not apply
    (an older kernel, a container that refuses namespaces or seccomp)."""
    applied = set(confinement.split(","))
    missing = [layer for layer in _FULL_CONFINEMENT if layer not in applied]
    if missing and sys.platform.startswith("linux") and confinement not in _warned:
        _warned.add(confinement)
        log.warning("PDF readers run with less confinement than they can have: %s not "
                    "applied here (docs/RELIABILITY.md, 'Threat model')", ", ".join(missing))


def _widen_pipe(pipe: Any) -> None:
    """Grow the pipe's buffer to 1 MiB (Linux), so a page image crosses it in a few reads."""
    try:
        fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, 1 << 20)
    except (OSError, AttributeError):  # not Linux, or above /proc/sys/fs/pipe-max-size
        pass


class _Died(Exception):
    """The reader process ended by itself (a limit, or a crash) with `status`."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    @property
    def how(self) -> str:
        return f"signal {-self.status}" if self.status < 0 else f"status {self.status}"

    @property
    def out_of_cpu(self) -> bool:
        return self.status == -signal.SIGXCPU


class PageReader:
    """One reader process holding one document. Not thread-safe: one request at a time.

    `max_pages` refuses a longer document at open (`TooManyPagesError`). With
    `decrypt_limit` > 0, the reader also returns the document decrypted (`decrypted`; None
    when it was not encrypted), refusing one whose decrypted form exceeds that many bytes.
    `ocr=False` keeps Tesseract's data out of the reader's reach (`inspect_pdf`). With
    `convert` (`to_pdf`'s keywords: filetype, label, dpi, max_pixels) the upload is an image,
    e-book, XPS or text that the reader first makes a PDF (`worker.ingest.convert`), at most
    `decrypt_limit` bytes, and returns (`converted`). The process
    is forked from this process's fork server (`worker.ingest.fork_server`: milliseconds
    instead of a Python start) where one runs, else (or with `fork_server=False`) started.
    With `limits.budget_mb` set, the reader first reserves `limits.memory_mb` of the
    process's reader budget (`worker.ingest.budget.READER_BUDGET`), waiting up to
    `budget_wait_s` (`ReaderBudgetError` past it), and gives it back when closed.
    """

    def __init__(self, data: bytes, *, password: str | None, limits: ReaderLimits,
                 max_pages: int | None = None, decrypt_limit: int = 0,
                 ocr: bool = True, fork_server: bool = True,
                 budget_wait_s: float = 0.0, convert: dict[str, Any] | None = None) -> None:
        self.limits = limits
        self._closing = False
        self._reservation: Reservation | None = None
        if limits.budget_mb:
            READER_BUDGET.resize(limits.budget_mb)
            self._reservation = READER_BUDGET.reserve(limits.memory_mb, budget_wait_s)
        try:
            self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
            tessdata = str(find_tessdata() or "") if ocr else ""
            argv = [str(limits.memory_mb * 2**20), str(limits.file_mb * 2**20),
                    str(limits.page_seconds)]
            forked = start_reader(argv, tessdata=tessdata or None, stderr=self._stderr) \
                if fork_server else None
            self._proc: ForkedReader | subprocess.Popen[bytes] = forked or subprocess.Popen(
                [sys.executable, "-c", _CHILD, *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                env=child_env(tessdata or None), close_fds=True)
        except BaseException:
            if self._reservation is not None:
                self._reservation.release()
            raise
        _widen_pipe(self._proc.stdout)
        request = {"op": "open", "password": password, "max_pages": max_pages,
                   "decrypt": decrypt_limit, "convert": convert}
        try:
            reply, blob = self._call(request, data, _START_SECONDS, max_blob=decrypt_limit)
        except ReaderTimeout:
            raise ReaderStartError(_START_SECONDS) from None
        except _Died as died:
            if died.out_of_cpu:
                raise OpenTimeLimitError(limits.page_seconds) from None
            raise OpenMemoryLimitError(limits.memory_mb,
                                       f"the reader process ended with {died.how}") from None
        except BaseException:
            self.close()
            raise
        if not reply["ok"]:
            self.close()
            if reply.get("kind") == "memory":
                raise OpenMemoryLimitError(limits.memory_mb)
            raise rebuild_error(str(reply.get("error", "")), str(reply["reason"]))
        self.facts = PdfFacts(page_count=int(reply["pages"]), title=reply.get("title"),
                              truncated=bool(reply.get("truncated")),
                              confinement=str(reply.get("confinement", "")))
        _warn_if_weak(self.facts.confinement)
        self.page_count = self.facts.page_count
        self.decrypted: bytes | None = blob if reply.get("decrypted") else None
        self.converted: bytes | None = blob if reply.get("converted") else None

    @property
    def pid(self) -> int:
        """The reader process's id."""
        return self._proc.pid

    def read(self, index: int, *, render: bool, dpi: int, max_pixels: int, ocr: bool,
             policy: TextPolicy) -> PageResult:
        """Read page `index` (0-based). A damaged page comes back with `error` set; a page
        past a limit raises `PageMemoryLimitError` or `PageTimeLimitError` (the reader is
        then dead: close it)."""
        request = {"op": "page", "index": index, "render": render, "dpi": dpi,
                   "max_pixels": max_pixels, "ocr": ocr, "policy": asdict(policy)}
        page = index + 1
        try:
            reply, pixels = self._call(request, b"", self.limits.page_seconds,
                                       max_blob=3 * max_pixels + (1 << 20))
        except ReaderTimeout:
            raise PageTimeLimitError(page, self.limits.page_seconds) from None
        except _Died as died:
            if died.out_of_cpu:
                raise PageTimeLimitError(page, self.limits.page_seconds) from None
            raise PageMemoryLimitError(page, self.limits.memory_mb,
                                       f"the reader process ended with {died.how}") from None
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
              max_blob: int) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait for its reply. Raises `ReaderTimeout` (the reader is
        then killed) or `_Died` when the reader ended; either way it is closed."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            write_frame(self._proc.stdin, header, blob)
            reply, payload = read_frame_fd(self._proc.stdout.fileno(),
                                           time.monotonic() + seconds, max_blob=max_blob)
        except ReaderTimeout:
            self.close()
            raise
        except ReaderGone:
            if self._closing:  # stopped by close(): not the request's doing
                raise
            if self._proc.poll() is None:  # alive but broke the protocol
                self._proc.kill()
            status = self._proc.wait()
            self._log_stderr_tail(logging.WARNING)
            self.close()
            raise _Died(status) from None
        if reply.get("log"):
            native_log.debug("%s: %s", header["op"] if header["op"] == "open"
                             else f"page {header['index'] + 1}", reply["log"].rstrip())
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
        if self._reservation is not None:  # the process is gone: its memory is free
            self._reservation.release()

    def __enter__(self) -> PageReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def inspect_pdf(data: bytes, *, password: str | None, max_pages: int, decrypt_limit: int,
                limits: ReaderLimits, convert: dict[str, Any] | None = None
                ) -> tuple[PdfFacts, bytes | None]:
    """Open the PDF in a confined reader process and return its facts and, when it was
    encrypted, its decrypted bytes (at most `decrypt_limit`); with `convert`, the PDF the
    reader made of the upload (`PageReader`) and that PDF's facts. Raises the `IngestError` of
    `open_pdf` (empty, not a PDF, damaged, password, page count) or `OpenLimitError`, and
    at once `ReaderBudgetError` when the process's reader budget is spent (an upload is
    refused rather than held waiting)."""
    with PageReader(data, password=password, limits=limits, max_pages=max_pages,
                    decrypt_limit=decrypt_limit, ocr=False, convert=convert) as reader:
        return reader.facts, reader.converted or reader.decrypted
