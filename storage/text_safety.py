"""One function that makes any text valid UTF-8 before it is stored or sent.

Text from libraries and files (MuPDF and Tesseract messages, PDF titles, page text, upload
file names) can hold lone surrogates: Python decodes undecodable bytes with `surrogateescape`
as U+DC80..U+DCFF, and JSON can carry `"\\udcc6"`. SQLite, Redis clients and the JSON encoder
of the API all refuse them (`surrogates not allowed`), so one such character in a stored
message made every read of its document, and of its collection's listing, a 500.

`safe_text` writes an escaped byte (U+DCC6, from byte 0xC6) as the text `\\xc6` and any other
lone surrogate as `\\udXXX`: readable, and valid UTF-8. Valid text comes back unchanged (the
same object), so callers can apply it everywhere at little cost. `printable_name` also
escapes the characters that are valid but not printable, for names that are shown.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that `surrogateescape` could not decode
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """`text` as valid UTF-8: every lone surrogate replaced by a readable escape."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape, text)
    return text


def _visible(ch: str) -> str:
    """`ch`, or its escape when it is not printable (a control, format or separator)."""
    if ch.isprintable():
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else (
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def printable_name(name: str) -> str:
    """`name` with printable characters only: every control, format or separator character
    (ESC, U+202E, a newline) written as its escape, so a stored file name shows what it was
    and cannot move a terminal's cursor or reorder what is printed around it."""
    name = safe_text(name)
    return name if name.isprintable() else "".join(map(_visible, name))


def safe_value(value: Any) -> Any:
    """`safe_text` applied to every string inside a JSON-like value (dicts, lists, tuples)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_value(k): safe_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(safe_value(v) for v in value)
    return value
