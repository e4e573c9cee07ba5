"""Images, e-books, XPS and text made into a PDF, inside a confined reader (never the API's
own process: `worker.ingest.reader_child` runs this on the bytes it received).

Images (PNG, JPEG, TIFF) are decoded by Pillow: each frame of a multi-page TIFF is one page,
turned upright by its EXIF orientation, sized so that a render at the service's resolution
gives back its pixels (scaled down to the pixel cap), and stored with no text layer, so the
page is OCR'd as a scanned PDF page is. An image whose decoded pixels would take more than a
quarter of the reader's memory is refused before it is decoded (a decompression bomb), and
one with more frames than the page cap is refused before any frame is decoded.

E-books, XPS and text go through PyMuPDF's own readers; reflowable ones (EPUB, text and
Markdown, shown as plain text) are laid out on A4 pages (the page the pixel cap is sized for).
"""

from __future__ import annotations

import io
import math

import pymupdf
from PIL import Image, ImageOps

from worker.ingest.errors import ImageTooLargeError, TooManyPagesError, UnreadableFileError

A4_POINTS = (595.0, 842.0)
_TEXT_FONT_SIZE = 11.0
_BYTES_PER_PIXEL = 4  # what Pillow holds per decoded pixel, at most (RGBA, 32-bit modes)


def image_pixel_cap(memory_bytes: int) -> int:
    """The most pixels an image may hold: decoded, it takes at most a quarter of the
    reader's address-space limit `memory_bytes`."""
    return max(1, memory_bytes // 4 // _BYTES_PER_PIXEL)


def to_pdf(data: bytes, filetype: str, *, label: str, dpi: int, max_pixels: int,
           max_pages: int, memory_bytes: int) -> bytes:
    """The PDF form of `data` of `filetype` (a `worker.ingest.formats` name; `label` what a
    user calls it). Raises `TooManyPagesError`, `ImageTooLargeError` or
    `UnreadableFileError`."""
    if filetype in ("png", "jpeg", "tiff"):
        return _image_pdf(data, label=label, dpi=dpi, max_pixels=max_pixels,
                          max_pages=max_pages, pixel_cap=image_pixel_cap(memory_bytes))
    try:
        doc = pymupdf.open(stream=data, filetype=filetype)
    except Exception as exc:  # FileDataError, RuntimeError, ValueError...
        raise UnreadableFileError(label) from exc
    with doc:
        if doc.is_reflowable:
            doc.layout(width=A4_POINTS[0], height=A4_POINTS[1], fontsize=_TEXT_FONT_SIZE)
        if doc.page_count > max_pages:
            raise TooManyPagesError(doc.page_count, max_pages, label)
        try:
            return bytes(doc.convert_to_pdf())
        except Exception as exc:
            raise UnreadableFileError(label, "it cannot be laid out as pages") from exc


def _image_pdf(data: bytes, *, label: str, dpi: int, max_pixels: int, max_pages: int,
               pixel_cap: int) -> bytes:
    Image.MAX_IMAGE_PIXELS = None  # `pixel_cap` replaces Pillow's own bomb check
    try:
        image = Image.open(io.BytesIO(data))
    except Exception as exc:  # UnidentifiedImageError, OSError
        raise UnreadableFileError(label) from exc
    frames = getattr(image, "n_frames", 1)
    if frames > max_pages:
        raise TooManyPagesError(frames, max_pages, label)
    out = pymupdf.open()
    try:
        for index in range(frames):
            image.seek(index)  # reads the frame's header only
            if image.width * image.height > pixel_cap:
                raise ImageTooLargeError(image.width, image.height, pixel_cap)
            _add_image_page(out, image, dpi=dpi, max_pixels=max_pixels)
        return bytes(out.tobytes(garbage=1, deflate=True))
    except (ImageTooLargeError, TooManyPagesError, MemoryError):
        raise
    except Exception as exc:  # a truncated or damaged frame
        raise UnreadableFileError(label, "a frame cannot be decoded") from exc
    finally:
        out.close()


def _add_image_page(out: pymupdf.Document, frame: Image.Image, *, dpi: int,
                    max_pixels: int) -> None:
    """One page holding `frame` upright, sized in points for `dpi`, at most `max_pixels`."""
    upright = ImageOps.exif_transpose(frame).convert("RGB")  # (H, W, 3) uint8 pixels
    width_pt = upright.width * 72.0 / dpi
    height_pt = upright.height * 72.0 / dpi
    if upright.width * upright.height > max_pixels:
        scale = math.sqrt(max_pixels / (upright.width * upright.height))
        upright = upright.resize((max(1, int(upright.width * scale)),
                                  max(1, int(upright.height * scale))), Image.Resampling.LANCZOS)
    encoded = io.BytesIO()
    upright.save(encoded, format="JPEG", quality=92)
    page = out.new_page(width=width_pt, height=height_pt)
    page.insert_image(page.rect, stream=encoded.getvalue())
