"""Rendering: RGB images at the asked dpi, never above the pixel cap."""

from __future__ import annotations

import pymupdf
import pytest

from lab.ingest.builders import huge_page_pdf, pdf_bytes, text_pages_pdf
from worker.ingest import CorruptPdfError, open_pdf, render_page
from worker.ingest.render import capped_dpi, capped_zoom


def test_renders_a4_at_dpi() -> None:
    doc = open_pdf(text_pages_pdf(["Hello"]), max_pages=5)
    image = render_page(doc, 0, dpi=72, max_pixels=10**7)
    assert image.mode == "RGB"
    assert image.size == (595, 842)
    # the page is white with black text: both occur
    extrema = image.convert("L").getextrema()
    assert extrema[0] < 64 and extrema[1] == 255


def test_pixel_cap_applies_before_rendering_a_huge_page() -> None:
    # 14,400 pt square page (200 inches) holding a 30,000 px square image: a small file
    data = huge_page_pdf(side_points=14_400, image_side_px=30_000)
    assert len(data) < 20_000
    doc = open_pdf(data, max_pages=5)
    cap = 1_000_000
    image = render_page(doc, 0, dpi=100, max_pixels=cap)
    assert image.width * image.height <= cap
    assert image.width * image.height > 0.9 * cap  # scaled down, not collapsed
    assert abs(image.width - image.height) <= 1


@pytest.mark.parametrize("cap", [10_000, 123_457, 2_000_000])
def test_cap_is_exact_for_odd_sizes(cap: int) -> None:
    doc = pymupdf.open()
    doc.new_page(width=611.3, height=791.7)
    opened = open_pdf(pdf_bytes(doc), max_pages=1)
    image = render_page(opened, 0, dpi=300, max_pixels=cap)
    assert image.width * image.height <= cap


def test_capped_zoom_leaves_small_pages_alone() -> None:
    rect = pymupdf.Rect(0, 0, 595, 842)
    assert capped_zoom(rect, dpi=144, max_pixels=10**8) == pytest.approx(2.0)
    assert capped_dpi(rect, dpi=144, max_pixels=10**8) == 144
    assert capped_dpi(rect, dpi=144, max_pixels=595 * 842) <= 72


def test_unrenderable_page_is_a_corrupt_pdf_error() -> None:
    doc = open_pdf(text_pages_pdf(["Hello"]), max_pages=5)
    with pytest.raises(CorruptPdfError):
        render_page(doc, 7, dpi=72, max_pixels=10**6)
