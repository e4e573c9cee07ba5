"""Render PDF pages to RGB PIL images under a pixel cap, in memory (no PNG round trip)."""

from __future__ import annotations

import math

import pymupdf
from PIL import Image

from worker.ingest.errors import CorruptPdfError

POINTS_PER_INCH = 72.0


def capped_zoom(rect: pymupdf.Rect, *, dpi: float, max_pixels: int) -> float:
    """The zoom factor for `dpi`, reduced so the rendered page has at most `max_pixels` pixels.

    The cap is applied before rendering: a tiny file can declare a page (or hold an image)
    tens of thousands of pixels on a side, and rendering first would exhaust memory.
    """
    if max_pixels < 1:
        raise ValueError("max_pixels must be positive")
    zoom = dpi / POINTS_PER_INCH
    width, height = max(rect.width, 1e-3), max(rect.height, 1e-3)
    # MuPDF rounds the pixmap outwards; budget one extra pixel per side.
    pixels = (width * zoom + 1) * (height * zoom + 1)
    if pixels > max_pixels:
        zoom *= math.sqrt(max_pixels / pixels) * 0.999
        while (width * zoom + 1) * (height * zoom + 1) > max_pixels and zoom > 1e-6:
            zoom *= 0.99
    return zoom


def capped_dpi(rect: pymupdf.Rect, *, dpi: float, max_pixels: int) -> int:
    """`dpi` lowered (as an integer) so a render of `rect` stays within `max_pixels`."""
    zoom = capped_zoom(rect, dpi=dpi, max_pixels=max_pixels)
    return max(1, math.floor(zoom * POINTS_PER_INCH))


def render_page(doc: pymupdf.Document, index: int, *, dpi: int, max_pixels: int) -> Image.Image:
    """Render page `index` (0-based) as an RGB image with width * height <= `max_pixels`.

    The pixmap's samples are handed to PIL directly. Raises `CorruptPdfError` when MuPDF
    cannot draw the page.
    """
    try:
        page = doc.load_page(index)
        zoom = capped_zoom(page.rect, dpi=dpi, max_pixels=max_pixels)
        pix = page.get_pixmap(
            matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB, alpha=False
        )
    except Exception as exc:
        raise CorruptPdfError(f"page {index + 1} cannot be rendered") from exc
    image = Image.frombytes("RGB", (pix.width, pix.height), pix.samples, "raw", "RGB",
                            pix.stride)
    if image.width * image.height > max_pixels:  # a rounding edge: never exceed the cap
        scale = math.sqrt(max_pixels / (image.width * image.height))
        image = image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))))
    return image
