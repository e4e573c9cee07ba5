"""Builders of real PDFs (PyMuPDF) for the ingestion and retrieval tests and the lab's
fuzz and ingest benches."""

from __future__ import annotations

import io
import zlib

import pymupdf
from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

LEFT_COLUMN = (
    "Left column. The harbour authority reported that the northern breakwater was "
    "rebuilt with granite blocks quarried in Aberdeen. Ferry traffic resumed in spring. "
) * 3
RIGHT_COLUMN = (
    "Right column. Beekeepers in the valley counted forty hives lost to varroa mites, "
    "and the cooperative bought oxalic acid in bulk. Honey prices rose. "
) * 3


def text_image(lines: list[str], *, size: tuple[int, int] = (1654, 2339),
               font_px: int = 44) -> bytes:
    """A PNG of black text on white: words that exist only as pixels."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font = _font(font_px)
    y = 120
    for line in lines:
        draw.text((120, y), line, fill="black", font=font)
        y += int(font_px * 1.6)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _font(px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype(FONT, px)
    except OSError:  # no DejaVu on this machine: Pillow's built-in scalable font
        return ImageFont.load_default(px)


def two_column_page(doc: pymupdf.Document) -> None:
    """Add an A4 page with two text columns."""
    page = doc.new_page(width=595, height=842)
    page.insert_textbox(pymupdf.Rect(50, 60, 290, 780), LEFT_COLUMN, fontsize=11)
    page.insert_textbox(pymupdf.Rect(305, 60, 545, 780), RIGHT_COLUMN, fontsize=11)


def image_only_page(doc: pymupdf.Document, lines: list[str], footer: str | None = None) -> None:
    """Add a page whose words are only inside an image (optionally a small text footer)."""
    page = doc.new_page(width=595, height=842)
    page.insert_image(page.rect, stream=text_image(lines))
    if footer:
        page.insert_text((50, 830), footer, fontsize=7)


def pdf_bytes(doc: pymupdf.Document, **save_options: object) -> bytes:
    """Serialise `doc` and close it."""
    data = doc.tobytes(garbage=3, deflate=True, **save_options)
    doc.close()
    return bytes(data)


def zero_page_pdf() -> bytes:
    """A syntactically valid PDF whose page tree is empty (PyMuPDF refuses to save one)."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [] /Count 0 >>",
    ]
    return _assemble(objects)


def huge_page_pdf(side_points: int, image_side_px: int) -> bytes:
    """One page `side_points` wide and high, covered by a 1-bit image `image_side_px` square.

    The image is zeros compressed twice with Flate, so the file stays tiny.
    """
    row = (image_side_px + 7) // 8
    packer = zlib.compressobj(9)
    block = bytes(row * 1000)
    parts = []
    for start in range(0, image_side_px, 1000):
        rows = min(1000, image_side_px - start)
        parts.append(packer.compress(block if rows == 1000 else bytes(row * rows)))
    parts.append(packer.flush())
    twice = zlib.compress(b"".join(parts), 9)
    content = b"q %d 0 0 %d 0 0 cm /Im0 Do Q" % (side_points, side_points)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] "
        b"/Resources << /XObject << /Im0 4 0 R >> >> /Contents 5 0 R >>"
        % (side_points, side_points),
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
        b"/BitsPerComponent 1 /Filter [/FlateDecode /FlateDecode] /Length %d >>\nstream\n"
        % (image_side_px, image_side_px, len(twice)) + twice + b"\nendstream",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    return _assemble(objects)


def _assemble(objects: list[bytes]) -> bytes:
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)


def text_pages_pdf(texts: list[str]) -> bytes:
    """A PDF with one A4 page per text."""
    doc = pymupdf.open()
    for text in texts:
        page = doc.new_page(width=595, height=842)
        page.insert_textbox(pymupdf.Rect(50, 60, 545, 780), text, fontsize=11)
    return pdf_bytes(doc)
