"""The page reader process: `main([MEMORY_BYTES])`, run as `python -c` by the sandbox.

Started by `worker.ingest.sandbox.PageReader`. It caps its own address space (RLIMIT_AS),
receives one PDF, then answers page requests one at a time over stdin/stdout frames
(`worker.ingest.frames`): each page rendered to raw RGB and its text read (OCR included).
Everything the native libraries (MuPDF, Tesseract, Leptonica) write to file descriptor 2,
or stray to descriptor 1, goes to a file the parent gave as stderr; each reply carries what
was written while the request ran, and the parent logs it at debug level.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import IO, Any

import pymupdf

from worker.ingest.errors import IngestError
from worker.ingest.frames import ReaderGone, read_frame, write_frame
from worker.ingest.pdf import missing_content_pages, open_pdf
from worker.ingest.render import render_page
from worker.ingest.text import PageText, TextPolicy, page_text

_MEMORY_WORDS = ("alloc", "out of memory", "memory")
_MAX_LOG = 8000


def main(argv: list[str]) -> int:
    """Serve one document; return the exit status."""
    memory = int(argv[0]) if argv else 0
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray write to stdout must not corrupt the replies
    requests = sys.stdin.buffer
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    # MuPDF's messages go to the log file too (and stay readable via mupdf_warnings())
    pymupdf.TOOLS.mupdf_display_errors(True)
    pymupdf.TOOLS.mupdf_display_warnings(True)
    try:
        _serve(requests, replies)
    except ReaderGone:  # the parent closed the pipe: done
        return 0
    return 0


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    header, data = read_frame(requests)
    try:
        doc = open_pdf(data, password=header.get("password"), max_pages=2**31 - 1)
    except IngestError as exc:
        write_frame(replies, {"ok": False, "kind": "ingest", "reason": exc.message,
                              "log": _new_log()})
        return
    del data
    missing = missing_content_pages(doc)
    write_frame(replies, {"ok": True, "pages": doc.page_count, "log": _new_log()})
    while True:
        header, _ = read_frame(requests)
        reply, pixels = _read_page(doc, header, missing)
        write_frame(replies, {**reply, "log": _new_log()}, pixels)


def _read_page(doc: pymupdf.Document, req: dict[str, Any],
               missing: set[int]) -> tuple[dict[str, Any], bytes]:
    index = int(req["index"])
    if index + 1 in missing:
        return {"ok": False, "kind": "damaged",
                "reason": "its content is missing from the file"}, b""
    pymupdf.TOOLS.mupdf_warnings(reset=True)
    image = None
    try:
        if req.get("render", True):
            image = render_page(doc, index, dpi=int(req["dpi"]), max_pixels=int(req["max_pixels"]))
        page = doc.load_page(index)
        rect = page.rect
    except MemoryError:
        return {"ok": False, "kind": "memory", "reason": "out of memory"}, b""
    except Exception as exc:
        return _failure(exc), b""
    damage = _damage(pymupdf.TOOLS.mupdf_warnings(reset=True))
    drew_blank = image is not None and _unicolor(image)
    # a damaged page that drew blank is not worth OCR: its text layer alone decides
    ocr = bool(req.get("ocr")) and not (damage and drew_blank)
    try:
        text = page_text(page, ocr=ocr, policy=TextPolicy(**req["policy"]))
    except MemoryError:
        return {"ok": False, "kind": "memory", "reason": "out of memory"}, b""
    except Exception as exc:  # the drawing survived: keep the page, without text
        if _is_memory(exc):
            return _failure(exc), b""
        text = PageText(text="", source="none")
    damage = damage or _damage(pymupdf.TOOLS.mupdf_warnings(reset=True))
    if damage and (image is None or drew_blank) and not text.text:
        return {"ok": False, "kind": "damaged", "reason": damage}, b""
    reply: dict[str, Any] = {"ok": True, "text": text.text, "source": text.source,
                             "width": rect.width, "height": rect.height}
    if image is None:
        return reply, b""
    reply["size"] = [image.width, image.height]
    return reply, image.tobytes()


def _unicolor(image: Any) -> bool:
    """True when every pixel of the RGB image has one colour (a blank render)."""
    return all(low == high for low, high in image.getextrema())


def _damage(warnings: str) -> str:
    """The first warning that says the page's data is damaged, or ""."""
    for line in warnings.splitlines():
        if any(word in line for word in ("error", "cannot", "premature", "not a stream")):
            return line.strip()[:200]
    return ""


def _is_memory(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, MemoryError) or any(word in text for word in _MEMORY_WORDS)


def _failure(exc: BaseException) -> dict[str, Any]:
    cause = exc.__cause__ or exc
    reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if reason.startswith("code="):  # MuPDF's "code=2: ..." prefix
        reason = reason.partition(": ")[2] or reason
    kind = "memory" if _is_memory(cause) else "damaged"
    return {"ok": False, "kind": kind, "reason": reason[:200]}


_log_offset = 0


def _new_log() -> str:
    """What was written to descriptor 2 (the parent's log file) since the last reply."""
    global _log_offset
    try:
        end = os.lseek(2, 0, os.SEEK_END)
        data = os.pread(2, min(end - _log_offset, _MAX_LOG), _log_offset) if end > _log_offset \
            else b""
    except OSError:  # stderr is not a file (run by hand on a terminal)
        return ""
    _log_offset = end
    return data.decode("utf-8", "replace")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
