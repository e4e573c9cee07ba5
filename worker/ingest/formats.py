"""What an upload is, decided by its content: the formats the service accepts and the sniff.

The first bytes decide (PDF, PNG, JPEG, TIFF, a zip container, text); for a zip container
the member that names its type does (`mimetype` for EPUB and OpenDocument,
`[Content_Types].xml` for Office Open XML and XPS). Only the zip's directory and those two
small members are read here, in the calling process: nothing is inflated beyond them, and a
container whose members would expand past `MAX_EXPANDED_BYTES` is refused before any reader
sees it (a zip bomb). The file name's extension may agree or say nothing; one naming another
known format is refused (`MisnamedFileError`), one naming no known format is ignored.

Each format has a `route`: how it becomes pages. `pdf` is read as uploaded; `image` and
`pymupdf` are turned into a PDF by a confined reader (`worker.ingest.convert`); `office` by
LibreOffice in a confined process (`worker.ingest.office`).
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from typing import Literal

from worker.ingest.errors import EmptyFileError, IngestError

Route = Literal["pdf", "image", "pymupdf", "office"]

# The most a zip container's members may expand to together (its directory's sizes).
MAX_EXPANDED_BYTES = 1 << 30
_TYPE_MEMBER_BYTES = 1 << 20  # `mimetype` / `[Content_Types].xml` read at most this large
_TEXT_WINDOW = 64 * 1024


@dataclass(frozen=True)
class Format:
    """One accepted format: its short `name` (the reader's file type), what a user calls it,
    its file extensions and how it becomes pages."""

    name: str
    label: str
    extensions: tuple[str, ...]
    route: Route


FORMATS: tuple[Format, ...] = (
    Format("pdf", "PDF document", (".pdf",), "pdf"),
    Format("png", "PNG image", (".png",), "image"),
    Format("jpeg", "JPEG image", (".jpg", ".jpeg", ".jpe", ".jfif"), "image"),
    Format("tiff", "TIFF image", (".tif", ".tiff"), "image"),
    Format("epub", "EPUB e-book", (".epub",), "pymupdf"),
    Format("xps", "XPS document", (".xps", ".oxps"), "pymupdf"),
    Format("txt", "text or Markdown file", (".txt", ".text", ".md", ".markdown"), "pymupdf"),
    Format("docx", "Word document", (".docx",), "office"),
    Format("xlsx", "Excel workbook", (".xlsx",), "office"),
    Format("pptx", "PowerPoint presentation", (".pptx",), "office"),
    Format("odt", "OpenDocument text", (".odt",), "office"),
    Format("ods", "OpenDocument spreadsheet", (".ods",), "office"),
    Format("odp", "OpenDocument presentation", (".odp",), "office"),
)
_BY_NAME = {f.name: f for f in FORMATS}
_BY_EXTENSION = {ext: f for f in FORMATS for ext in f.extensions}

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"),
    (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))
_ZIP_MIMETYPES = {
    "application/epub+zip": "epub",
    "application/vnd.oasis.opendocument.text": "odt",
    "application/vnd.oasis.opendocument.spreadsheet": "ods",
    "application/vnd.oasis.opendocument.presentation": "odp",
}
_OOXML_MAIN = "application/vnd.openxmlformats-officedocument."
_CONTENT_TYPES = {
    _OOXML_MAIN + "wordprocessingml.document.main+xml": "docx",
    _OOXML_MAIN + "spreadsheetml.sheet.main+xml": "xlsx",
    _OOXML_MAIN + "presentationml.presentation.main+xml": "pptx",
    "application/vnd.ms-package.xps-fixeddocumentsequence+xml": "xps",
    "application/vnd.ms-package.xps-fixeddocument+xml": "xps",
    "application/oxps": "xps",
}
_MACRO_TYPES = re.compile(r"application/vnd\.ms-(word|excel|powerpoint)\.[\w.]*macroEnabled",
                          re.IGNORECASE)
# members that hold macros whatever the declared type says: an OpenDocument's Basic libraries
# and scripts, an Office Open XML file's VBA project
_MACRO_MEMBERS = re.compile(r"^(Basic|Scripts)/|(^|/)vbaProject\.bin$", re.IGNORECASE)


class UnsupportedFormatError(IngestError):
    """The upload's content is none of the accepted formats (415, naming them)."""

    http_status = 415

    def __init__(self, what: str) -> None:
        super().__init__(f"The uploaded file is {what}, which is not accepted. Accepted: "
                         f"{accepted_summary()}.")


class MisnamedFileError(IngestError):
    """The file name's extension names another format than its content (422)."""

    def __init__(self, named: Format, extension: str, found: Format) -> None:
        super().__init__(f"The uploaded file is not a {named.label}: its name ends in "
                         f"{extension}, but its content is a {found.label}. Rename it or "
                         "upload the intended file.")


class ZipBombError(IngestError):
    """A zip container whose members would expand past `MAX_EXPANDED_BYTES` (422)."""

    def __init__(self, expanded: int) -> None:
        super().__init__(f"The file's zip members would expand to {expanded} bytes; at most "
                         f"{MAX_EXPANDED_BYTES} are accepted. The file was not accepted.")


def accepted_summary() -> str:
    """The accepted formats for a message: "PDF document (.pdf), PNG image (.png), ..."."""
    return ", ".join(f"{f.label} ({', '.join(f.extensions)})" for f in FORMATS)


def sniff(data: bytes, filename: str | None = None) -> Format:
    """The format of `data`, checked against `filename`'s extension. Raises
    `EmptyFileError`, `UnsupportedFormatError` (415), `MisnamedFileError` or `ZipBombError`."""
    if not data:
        raise EmptyFileError()
    found = _BY_NAME[_content_format(data)]
    extension = _extension(filename)
    named = _BY_EXTENSION.get(extension)
    if named is not None and named is not found:
        raise MisnamedFileError(named, extension, found)
    return found


def _extension(filename: str | None) -> str:
    if not filename or "." not in filename:
        return ""
    return "." + filename.rsplit(".", 1)[1].lower()


def _content_format(data: bytes) -> str:
    if b"%PDF-" in data[:1024]:  # readers accept the header anywhere in the first 1024 bytes
        return "pdf"
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data.startswith(b"PK\x03\x04"):
        return _zip_format(data)
    if _is_text(data[:_TEXT_WINDOW]):
        return "txt"
    raise UnsupportedFormatError("of an unknown binary type")


def _is_text(head: bytes) -> bool:
    """UTF-8 (a sequence cut by the window's end allowed), no NUL, few control bytes."""
    if b"\x00" in head:
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return False
        text = head[:exc.start].decode("utf-8")
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f")
    return controls <= len(text) // 100


def _zip_format(data: bytes) -> str:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = {info.filename: info for info in archive.infolist()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        raise UnsupportedFormatError("a damaged zip archive") from None
    expanded = sum(info.file_size for info in members.values())
    if expanded > MAX_EXPANDED_BYTES:
        raise ZipBombError(expanded)
    if any(_MACRO_MEMBERS.search(name) for name in members):
        raise UnsupportedFormatError("a document that carries macros (save it without macros)")
    with archive:
        mimetype = _member_text(archive, members.get("mimetype")).strip()
        if mimetype in _ZIP_MIMETYPES:
            return _ZIP_MIMETYPES[mimetype]
        types = _member_text(archive, members.get("[Content_Types].xml"))
    if _MACRO_TYPES.search(types):
        raise UnsupportedFormatError("a macro-enabled Office file (save it without macros)")
    for content_type, name in _CONTENT_TYPES.items():
        if f'"{content_type}"' in types:
            return name
    raise UnsupportedFormatError("a zip archive of no accepted type")


def _member_text(archive: zipfile.ZipFile, info: zipfile.ZipInfo | None) -> str:
    """A small member's text ("" when absent, too large or unreadable)."""
    if info is None or info.file_size > _TYPE_MEMBER_BYTES:
        return ""
    try:
        return archive.read(info).decode("utf-8", "replace")
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError):
        return ""
