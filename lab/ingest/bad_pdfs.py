"""Builders of damaged and hostile PDFs for the ingestion tests (issues 13 and 18)."""

from __future__ import annotations

import re
import zlib

import pymupdf

from lab.ingest.builders import _assemble

PAGE_WORDS = ["harbour", "valve", "turbine", "ledger", "granite", "ferry", "beacon", "tide"]


def paper_pdf(pages: int = 14, *, noisy_last_page: bool = False) -> bytes:
    """A text PDF of `pages` pages, each naming its number ("page 7 of the survey"),
    written without object streams so its objects can be found and damaged by offset;
    with `noisy_last_page`, one more page from `leptonica_noise_page`."""
    doc = pymupdf.open()
    for n in range(1, pages + 1):
        page = doc.new_page(width=595, height=842)
        words = " ".join(PAGE_WORDS[(n + i) % len(PAGE_WORDS)] for i in range(300))
        page.insert_textbox(pymupdf.Rect(50, 60, 545, 780),
                            f"This is page {n} of the survey. {words}", fontsize=9)
    if noisy_last_page:
        leptonica_noise_page(doc)
    data = doc.tobytes(garbage=1, deflate=True)
    doc.close()
    return bytes(data)


def flip_content_bytes(data: bytes, page_numbers: list[int]) -> bytes:
    """XOR 0xFF into the middle of the compressed content stream of each given (1-based)
    page: bit rot that MuPDF reports while drawing, the page then drawing blank."""
    doc = pymupdf.open("pdf", data)
    out = bytearray(data)
    for number in page_numbers:
        kind, value = doc.xref_get_key(doc.page_xref(number - 1), "Contents")
        xref = int(re.findall(r"(\d+) 0 R", value)[0])
        start = out.index(b"\n%d 0 obj" % xref) + 1
        body = out.index(b"stream", start) + len(b"stream\n")
        for offset in range(body + 2, body + 40, 3):
            out[offset] ^= 0xFF
    doc.close()
    return bytes(out)


def bit_rot(data: bytes, every: int = 4096) -> bytes:
    """One byte XOR 0xFF every `every` bytes, as a failing disk leaves a file."""
    out = bytearray(data)
    for offset in range(every, len(out), every):
        out[offset] ^= 0xFF
    return bytes(out)


def without_trailer(data: bytes) -> bytes:
    """The file cut before its cross-reference table: no `xref`, no trailer, no `%%EOF`
    (every object is still there, so MuPDF rebuilds the table)."""
    return data[: data.rindex(b"\nxref") + 1]



def leptonica_noise_page(doc: pymupdf.Document) -> None:
    """Append a page that makes Tesseract and Leptonica write to descriptor 2 when OCR'd:
    a 2 x 36 pixel black image stretched over the page (its text line is 2 pixels wide at
    OCR resolution: "Image too small to scale!! (2x36 vs min width of 3)") and a short
    text line, so the page is also indexed by its text layer."""
    page = doc.new_page(width=300, height=300)
    page.insert_image(page.rect, pixmap=pymupdf.Pixmap(pymupdf.csGRAY, 2, 36, bytes(72), False))
    page.insert_text((5, 280), "harbour valve turbine " * 2, fontsize=8)


BOMB_KINDS = {
    # one text string of `mib` MiB: MuPDF's lexer holds the whole token (a memory bomb)
    "string": (b"BT /F1 12 Tf 72 72 Td (", b"A" * 64, b") Tj ET\n"),
    # blank space: streamed, so only a time bomb (about 6 s per GiB here)
    "spaces": (b"", b" " * 64, b""),
    # tiny line segments: about 0.08 s of CPU per MiB at 100 dpi here and 3.5 MB of memory
    # per MiB (a 64 MiB page reads in 5 s of CPU), so not a reliable time bomb
    "paths": (b"", b"0 0 m 1 1 l S\n" * 4 + b" " * 8, b""),
    # page-sized filled rectangles: every fill paints every pixel of the page, about 23 s of
    # CPU per MiB at 100 dpi (6 s at 50 dpi) here, in flat memory: a time bomb for any limit
    "fills": (b"", b"0 0 612 792 re f\n" * 3 + b" " * 13, b""),
}


def content_bomb_pdf(mib: int, *, kind: str = "string", pages_before: int = 1) -> bytes:
    """`pages_before` ordinary pages, then one page whose content stream inflates to about
    `mib` MiB (see `BOMB_KINDS`). The file is 1 to 4 KiB per MiB of content, built in
    well under a second: the MiB chunk is compressed once and its bytes repeated."""
    head, unit, tail = BOMB_KINDS[kind]
    chunk = unit * ((1 << 20) // len(unit))
    packer = zlib.compressobj(9)
    # after a full flush the compressor starts afresh, so every chunk compresses the same
    parts = [packer.compress(head) + packer.flush(zlib.Z_FULL_FLUSH),
             packer.compress(chunk) + packer.flush(zlib.Z_FULL_FLUSH)]
    last = packer.compress(tail) + packer.flush()
    adler = zlib.adler32(head)
    for _ in range(mib):
        adler = zlib.adler32(chunk, adler)
    adler = zlib.adler32(tail, adler)
    stream = parts[0] + parts[1] * mib + last[:-4] + adler.to_bytes(4, "big")
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages_before + 1)).encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages_before + 1)]
    font = b"<< /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >>"
    for i in range(pages_before):
        text = b"BT /F1 14 Tf 72 720 Td (An ordinary page %d before the bomb.) Tj ET" % (i + 1)
        objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s "
                    b"/Contents %d 0 R >>" % (font, 4 + 2 * i),
                    b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream"]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s "
                b"/Contents %d 0 R >>" % (font, 4 + 2 * pages_before),
                b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream
                + b"\nendstream"]
    return _assemble(objects)
