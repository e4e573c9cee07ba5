"""The reader process: `main([MEMORY_BYTES, FILE_BYTES, SECONDS])`, run as `python -c`.

Started by `worker.ingest.sandbox.PageReader` with a minimal environment. Once its modules
are imported it confines itself (`worker.ingest.confine`: address space, file size, no
network, read access to system and Python files only), receives one PDF, opens it with at
most SECONDS of CPU time and replies with its facts (page count, title, truncation; and its
decrypted bytes when asked), then answers page requests one at a time over stdin/stdout
frames (`worker.ingest.frames`), each with SECONDS more of CPU time: each page rendered to
raw RGB and its text read (OCR included).
Everything the native libraries (MuPDF, Tesseract, Leptonica) write to file descriptor 2,
or stray to descriptor 1, goes to a file the parent gave as stderr; each reply carries what
was written while the request ran, and the parent logs it at debug level.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

import pymupdf

from worker.ingest.confine import confine, cpu_limit
from worker.ingest.convert import to_pdf
from worker.ingest.errors import CorruptPdfError, IngestError, UnreadableFileError
from worker.ingest.frames import ReaderGone, read_frame, write_frame
from worker.ingest.pdf import looks_truncated, missing_content_pages, open_pdf
from worker.ingest.render import render_page
from worker.ingest.text import PageText, TextPolicy, page_text

_MEMORY_WORDS = ("alloc", "out of memory", "memory")
_MAX_LOG = 8000


def main(argv: list[str]) -> int:
    """Serve one document; return the exit status."""
    memory, file_bytes, seconds = (int(argv[0]), int(argv[1]), float(argv[2])) \
        if len(argv) >= 3 else (0, 0, 0.0)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray write to stdout must not corrupt the replies
    requests = sys.stdin.buffer
    # MuPDF's messages go to the log file too (and stay readable via mupdf_warnings())
    pymupdf.TOOLS.mupdf_display_errors(True)
    pymupdf.TOOLS.mupdf_display_warnings(True)
    confinement = confine(memory_bytes=memory, file_bytes=file_bytes)
    try:
        _serve(requests, replies, seconds, confinement, memory)
    except ReaderGone:  # the parent closed the pipe: done
        return 0
    return 0


def _serve(requests: IO[bytes], replies: IO[bytes], seconds: float,
           confinement: str, memory: int) -> None:
    header, data = read_frame(requests)
    if seconds > 0:
        cpu_limit(seconds)
    reply, blob, doc = _open(data, header, memory)
    del data
    write_frame(replies, {**reply, "confinement": confinement, "log": _new_log()}, blob)
    if doc is None:
        return
    del blob
    missing = missing_content_pages(doc)
    while True:
        header, _ = read_frame(requests)
        if seconds > 0:
            cpu_limit(seconds)
        reply, pixels = _read_page(doc, header, missing)
        write_frame(replies, {**reply, "log": _new_log()}, pixels)


def _open(data: bytes, req: dict[str, Any], memory: int
          ) -> tuple[dict[str, Any], bytes, pymupdf.Document | None]:
    """Open the document and describe it: (reply, decrypted or converted bytes or b"",
    document). With `req["convert"]` the upload is first made a PDF
    (`worker.ingest.convert.to_pdf`) and that PDF is what is opened and sent back."""
    password = req.get("password")
    max_pages = req.get("max_pages") or 2**31 - 1
    limit = int(req.get("decrypt") or 0)
    try:
        convert = req.get("convert")
        if convert:
            data = to_pdf(data, max_pages=max_pages, memory_bytes=memory, **convert)
            if len(data) > limit:
                raise UnreadableFileError(convert["label"], f"as a PDF it would be "
                                          f"{len(data)} bytes; the limit is {limit} bytes")
        doc = open_pdf(data, password=password, max_pages=max_pages)
        reply: dict[str, Any] = {"ok": True, "pages": doc.page_count, "title": _title(doc),
                                 "truncated": looks_truncated(doc, data)}
        blob = b""
        if convert:
            blob, reply["converted"] = data, True
        elif limit > 0 and (password or doc.is_encrypted):
            # `needs_pass` read after authenticating makes every page read blank: ask for
            # the password first (an unlocked file), then `is_encrypted` (owner-only files).
            blob = doc.tobytes(encryption=pymupdf.mupdf.PDF_ENCRYPT_NONE, garbage=1)
            if len(blob) > limit:
                raise CorruptPdfError(f"decrypted, it would be {len(blob)} bytes; the limit "
                                      f"is {limit} bytes")
            reply["decrypted"] = True
        return reply, blob, doc
    except IngestError as exc:
        return {"ok": False, "kind": "ingest", "error": type(exc).__name__,
                "reason": exc.message}, b"", None
    except Exception as exc:  # MemoryError, or a MuPDF error open_pdf let through
        if _is_memory(exc):
            return {**_failure(exc), "kind": "memory"}, b"", None
        return {"ok": False, "kind": "ingest", "error": "CorruptPdfError",
                "reason": CorruptPdfError().message}, b"", None


def _title(doc: pymupdf.Document) -> str | None:
    """The PDF's title, or None (also when a damaged Info dictionary cannot be read)."""
    try:
        title = (doc.metadata or {}).get("title")
    except Exception:  # noqa: BLE001 - a damaged file: index without its title
        return None
    return str(title) if title else None


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
