"""The object-stream bomb of issue 30: a one-page PDF whose `/Pages` object lives in a
FlateDecode object stream (`/Type /ObjStm`) with a `/Junk (AAAA...)` entry that inflates
about 1000:1, found through a cross-reference stream. Opening the file (not drawing it)
makes MuPDF inflate and hold the whole object stream."""

from __future__ import annotations

import zlib


def objstm_bomb_pdf(compressed_bytes: int) -> bytes:
    """A bomb whose object stream is about `compressed_bytes` long in the file (it inflates
    to about 1000 times that)."""
    junk_len = compressed_bytes * 1030  # zlib's ratio on a run of one byte is about 1030:1
    pages = b"<< /Type /Pages /Kids [3 0 R] /Count 1 /Junk ("
    tail = b") >>"
    offsets = b"2 0 "
    comp = zlib.compressobj(9)
    parts = [comp.compress(offsets + pages)]
    block = b"A" * (1 << 20)
    left = junk_len
    while left > 0:
        parts.append(comp.compress(block[:min(left, len(block))]))
        left -= len(block)
    parts.append(comp.compress(tail))
    parts.append(comp.flush())
    stream = b"".join(parts)

    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    where: dict[int, int] = {}

    def add(num: int, body: bytes) -> None:
        where[num] = len(out)
        out.extend(b"%d 0 obj\n" % num + body + b"\nendobj\n")

    add(1, b"<< /Type /Catalog /Pages 2 0 R >>")
    add(3, b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>")
    add(4, b"<< /Type /ObjStm /N 1 /First %d /Filter /FlateDecode /Length %d >>\nstream\n"
        % (len(offsets), len(stream)) + stream + b"\nendstream")
    rows = [(0, 0, 0xFFFF), (1, where[1], 0), (2, 4, 0), (1, where[3], 0), (1, where[4], 0)]
    xref_at = len(out)
    rows.append((1, xref_at, 0))
    table = b"".join(bytes([kind]) + field.to_bytes(4, "big") + gen.to_bytes(2, "big")
                     for kind, field, gen in rows)
    out.extend(b"5 0 obj\n<< /Type /XRef /Size 6 /W [1 4 2] /Root 1 0 R /Length %d >>\n"
               b"stream\n" % len(table) + table + b"\nendstream\nendobj\n")
    out.extend(b"startxref\n%d\n%%%%EOF\n" % xref_at)
    return bytes(out)
