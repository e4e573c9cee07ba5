"""Office and OpenDocument files made into a PDF by LibreOffice headless, confined.

`office_to_pdf` writes the upload into a private temporary folder, starts
`worker.ingest.office_child` there in its own session (process group) with a minimal
environment, reserves its memory from the process's reader budget (`worker.ingest.budget`),
and waits for the PDF under the wall-clock limit; past it, or when a limit ends LibreOffice,
the whole group is killed and the upload refused with a message naming the limit. The folder
goes with the call, whatever happened. Slides keep their numbers as page numbers (hidden
slides are exported too) and each sheet of a workbook is one page.

A presentation's slides and a workbook's sheets are counted before LibreOffice starts, and a
file with more than the page cap is refused at once (`check_page_count`): Office Open XML's from
the zip's directory (one member a slide or sheet), OpenDocument's from `content.xml`, streamed
in chunks and never inflated past `_CONTENT_BOUND` (a file whose count the bound cuts is left to
LibreOffice's limits).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

from worker.ingest.budget import READER_BUDGET
from worker.ingest.confine import child_env
from worker.ingest.errors import IngestError, TooManyPagesError
from worker.ingest.formats import Format, UnsupportedFormatError

# Debian packages that give LibreOffice headless what it needs to read these formats.
OFFICE_PACKAGES = ("libreoffice-writer-nogui", "libreoffice-calc-nogui",
                   "libreoffice-impress-nogui")
_CHILD = ("import sys; from worker.ingest.office_child import main; "
          "sys.exit(main(sys.argv[1:]))")
_TRUE = {"type": "boolean", "value": "true"}
_FILTERS = {
    "docx": "writer_pdf_Export", "odt": "writer_pdf_Export",
    "xlsx": "calc_pdf_Export:" + json.dumps({"SinglePageSheets": _TRUE}),
    "ods": "calc_pdf_Export:" + json.dumps({"SinglePageSheets": _TRUE}),
    "pptx": "impress_pdf_Export:" + json.dumps({"ExportHiddenSlides": _TRUE}),
    "odp": "impress_pdf_Export:" + json.dumps({"ExportHiddenSlides": _TRUE}),
}
# Office Open XML: the zip members that are one page each.
_PAGE_MEMBERS = {"pptx": re.compile(r"ppt/slides/slide\d+\.xml"),
                 "xlsx": re.compile(r"xl/worksheets/sheet\d+\.xml")}
# OpenDocument: the content.xml elements that are one page each (a slide, a sheet).
_PAGE_ELEMENTS = {"odp": re.compile(rb"<draw:page[\s/>]"),
                  "ods": re.compile(rb"<table:table[\s/>]")}
_CONTENT_BOUND = 64 << 20  # bytes of content.xml inflated at most to count its pages
_CHUNK = 1 << 20


class OfficeUnavailableError(UnsupportedFormatError):
    """Office conversion is off, or LibreOffice is not installed (415, saying what to do)."""

    def __init__(self, fmt: Format, reason: str) -> None:
        IngestError.__init__(self, f"The uploaded file is a {fmt.label}, and {reason}. "
                             "PDFs, images, e-books, XPS and text files are accepted here.")


class OfficeConversionError(IngestError):
    """LibreOffice could not convert the file, or went past a limit (422)."""


def soffice_path() -> str | None:
    """LibreOffice's `soffice`, or None when it is not installed."""
    return shutil.which("soffice") or shutil.which("libreoffice")


def check_office(fmt: Format, *, enabled: bool) -> str:
    """The `soffice` to run for `fmt`; `OfficeUnavailableError` when conversion is turned
    off (CONDUIT_OFFICE_CONVERSION) or LibreOffice is missing."""
    if not enabled:
        raise OfficeUnavailableError(fmt, "this service does not convert Office files "
                                     "(CONDUIT_OFFICE_CONVERSION is off)")
    soffice = soffice_path()
    if soffice is None:
        raise OfficeUnavailableError(fmt, "LibreOffice is not installed on this server "
                                     f"(apt-get install {' '.join(OFFICE_PACKAGES)})")
    return soffice


def check_page_count(data: bytes, fmt: Format, max_pages: int) -> None:
    """Refuse a presentation or workbook with more slides or sheets than `max_pages`
    (`TooManyPagesError`); other formats pass. `data` is a zip that `sniff` accepted."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        if fmt.name in _PAGE_MEMBERS:
            member = _PAGE_MEMBERS[fmt.name]
            pages = sum(1 for name in archive.namelist() if member.fullmatch(name))
        elif fmt.name in _PAGE_ELEMENTS:
            pages = _count_elements(archive, _PAGE_ELEMENTS[fmt.name])
        else:
            return
    if pages > max_pages:
        raise TooManyPagesError(pages, max_pages, fmt.label)


def _count_elements(archive: zipfile.ZipFile, element: re.Pattern[bytes]) -> int:
    """How many `element`s the first `_CONTENT_BOUND` bytes of content.xml hold (0 when it
    is missing or unreadable), inflated a chunk at a time."""
    try:
        stream = archive.open("content.xml")
    except (KeyError, zipfile.BadZipFile, ValueError, NotImplementedError, RuntimeError):
        return 0  # RuntimeError: an encrypted member
    count, tail, read = 0, b"", 0
    with stream:
        while read < _CONTENT_BOUND:
            try:
                chunk = stream.read(_CHUNK)
            except (zipfile.BadZipFile, OSError, EOFError, zlib.error):
                break
            if not chunk:
                break
            read += len(chunk)
            window = tail + chunk  # a tag cut by the chunk's end is counted in the next
            ends = [m.end() for m in element.finditer(window)]
            count += len(ends)
            keep = max(ends[-1] if ends else 0, len(window) - 32)
            tail = window[keep:]
    return count


def office_to_pdf(data: bytes, fmt: Format, *, soffice: str, memory_mb: int, seconds: float,
                  max_bytes: int, budget_mb: int = 0) -> bytes:
    """The PDF LibreOffice makes of `data` (at most `max_bytes`), converted under
    `memory_mb` of address space and `seconds` of wall-clock and CPU time; raises
    `OfficeConversionError` naming what failed, or `ReaderBudgetError` at once when the
    reader budget (`budget_mb`, 0 = none) is spent."""
    reservation = None
    if budget_mb:
        READER_BUDGET.resize(budget_mb)
        reservation = READER_BUDGET.reserve(memory_mb, 0.0)
    try:
        with tempfile.TemporaryDirectory(prefix="conduit-office-") as work:
            return _convert(Path(work), data, fmt, soffice=soffice, memory_mb=memory_mb,
                            seconds=seconds, max_bytes=max_bytes)
    finally:
        if reservation is not None:
            reservation.release()


def _convert(work: Path, data: bytes, fmt: Format, *, soffice: str, memory_mb: int,
             seconds: float, max_bytes: int) -> bytes:
    source = work / f"upload{fmt.extensions[0]}"
    source.write_bytes(data)
    argv = [sys.executable, "-c", _CHILD, str(memory_mb * 2**20), str(max_bytes),
            str(max(1, int(seconds))), soffice, _FILTERS[fmt.name], source.name]
    with open(work / "log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=work, env=child_env(), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            raise OfficeConversionError(
                f"Converting the {fmt.label} took longer than the {seconds:g} s limit "
                "(CONDUIT_OFFICE_TIMEOUT_S); LibreOffice was stopped and the file was not "
                "accepted.") from None
        finally:
            _kill_group(proc)
    pdf = work / "out" / f"{source.stem}.pdf"
    if status != 0 or not pdf.is_file():
        how = f"signal {-status}" if status < 0 else f"status {status}"
        raise OfficeConversionError(
            f"LibreOffice could not convert the {fmt.label} (it ended with {how}; it may be "
            f"damaged, or need more than the {memory_mb} MiB memory limit, "
            "CONDUIT_PAGE_MEMORY_MB, or the CPU time of CONDUIT_OFFICE_TIMEOUT_S).")
    if pdf.stat().st_size > max_bytes:
        raise OfficeConversionError(f"The {fmt.label} as a PDF is larger than the "
                                    f"{max_bytes} bytes accepted.")
    return pdf.read_bytes()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End LibreOffice's whole process group (its launcher and office process) and reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is gone already
        pass
    proc.wait()
