"""Page text: text layers are used, image-only pages are OCRed, and progress is reported."""

from __future__ import annotations

import pymupdf
import pytest

from lab.ingest.builders import (
    image_only_page,
    pdf_bytes,
    text_image,
    text_pages_pdf,
    two_column_page,
)
from worker.ingest import (
    Deadline,
    IngestTimeoutError,
    Progress,
    iter_pages,
    ocr_available,
    open_pdf,
    page_text,
    usable_text_layer,
)

needs_ocr = pytest.mark.skipif(not ocr_available(), reason="tesseract language data missing")

SCAN_LINES = [
    "Maintenance log of the Vindeby wind farm",
    "Turbine 7 gearbox replaced on 14 March",
    "Blade inspection found erosion on turbine 3",
]


def test_multi_column_text_keeps_each_column_in_order() -> None:
    doc = pymupdf.open()
    two_column_page(doc)
    opened = open_pdf(pdf_bytes(doc), max_pages=5)
    text = page_text(opened.load_page(0), ocr=True)
    assert text.source == "text_layer"
    flat = " ".join(text.text.split())
    assert "northern breakwater was rebuilt with granite blocks quarried in Aberdeen" in flat
    assert "forty hives lost to varroa mites" in flat
    # columns are read one after the other, not interleaved line by line
    assert flat.index("Aberdeen") < flat.index("Right column.")


def test_usable_text_layer_rules() -> None:
    assert usable_text_layer("The quarterly report covers revenue and staff numbers.")
    assert not usable_text_layer("3")
    assert not usable_text_layer("")
    assert not usable_text_layer("\ufffd" * 30 + " abc def ghi jkl mno pqr stu vwx yz")


@needs_ocr
def test_image_only_page_is_read_by_ocr() -> None:
    doc = pymupdf.open()
    image_only_page(doc, SCAN_LINES)
    opened = open_pdf(pdf_bytes(doc), max_pages=5)
    assert opened[0].get_text().strip() == ""  # nothing in the text layer
    text = page_text(opened.load_page(0), ocr=True)
    assert text.source == "ocr"
    assert "Vindeby" in text.text
    assert "gearbox" in text.text and "erosion" in text.text


@needs_ocr
def test_scan_with_a_stamped_footer_is_still_ocred() -> None:
    doc = pymupdf.open()
    image_only_page(doc, SCAN_LINES, footer="Confidential - scanned copy - page 1 of 1")
    opened = open_pdf(pdf_bytes(doc), max_pages=5)
    text = page_text(opened.load_page(0), ocr=True)
    assert text.source == "ocr"
    assert "gearbox" in text.text


def test_ocr_off_reports_no_text_for_an_image_only_page() -> None:
    doc = pymupdf.open()
    image_only_page(doc, SCAN_LINES)
    opened = open_pdf(pdf_bytes(doc), max_pages=5)
    text = page_text(opened.load_page(0), ocr=False)
    assert text.source == "none" and text.text == ""


def test_iter_pages_reports_progress_and_yields_every_page() -> None:
    data = text_pages_pdf([f"Chapter {i} on the migration of arctic terns." for i in range(4)])
    events: list[Progress] = []
    pages = list(iter_pages(data, dpi=50, max_pixels=10**6, ocr=False,
                            on_progress=events.append))
    assert [p.number for p in pages] == [1, 2, 3, 4]
    assert all(p.image is not None and p.image.size == (p.width, p.height) for p in pages)
    assert "Chapter 2" in pages[2].text.text
    assert events[:2] == [Progress("render", 1, 4), Progress("text", 1, 4)]
    assert events[-1] == Progress("text", 4, 4)


def test_iter_pages_without_rendering() -> None:
    (page,) = list(iter_pages(text_pages_pdf(["Alpha page text here."]), dpi=72,
                              max_pixels=10**7, ocr=False, render=False))
    assert page.image is None and (page.width, page.height) == (595, 842)


def test_deadline_stops_between_pages() -> None:
    ticks = iter(range(100))  # a clock read ticks one second: opening reads it a few times
    deadline = Deadline(9.5, clock=lambda: float(next(ticks)))
    data = text_pages_pdf([f"Page {i}" for i in range(10)])
    seen = []
    with pytest.raises(IngestTimeoutError) as info:
        for page in iter_pages(data, dpi=30, max_pixels=10**6, ocr=False, deadline=deadline):
            seen.append(page.number)
    assert seen and len(seen) < 10
    assert "9.5 s limit" in info.value.message
    assert info.value.pages_total == 10


@needs_ocr
def test_caption_over_a_large_image_keeps_the_layer_and_adds_the_image_words() -> None:
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    page.insert_image(pymupdf.Rect(0, 120, 595, 842), stream=text_image(SCAN_LINES))
    page.insert_text((50, 60), "Figure 4: photograph of the maintenance whiteboard", fontsize=12)
    opened = open_pdf(pdf_bytes(doc), max_pages=5)
    text = page_text(opened.load_page(0), ocr=True)
    assert text.source == "ocr"
    assert "photograph of the maintenance whiteboard" in text.text  # the layer is kept
    assert "gearbox" in text.text and "Vindeby" in text.text  # the image is read


@needs_ocr
def test_a_chart_on_a_page_full_of_text_is_read_too() -> None:
    """A report page: two columns of prose and a chart image whose labels exist only as
    pixels. The long text layer is kept and the chart's words are added."""
    doc = pymupdf.open()
    two_column_page(doc)
    page = doc[0]
    page.insert_image(pymupdf.Rect(50, 500, 545, 790), stream=text_image(
        ["Revenue by segment 2023", "Wholesale 715", "Consumer 595"], size=(1400, 800),
        font_px=60))
    opened = open_pdf(pdf_bytes(doc), max_pages=5)
    layer = opened[0].get_text("text")
    assert "Wholesale" not in layer and len(layer) > 400
    text = page_text(opened.load_page(0), ocr=True)
    assert text.source == "ocr"
    assert "Wholesale" in text.text and "715" in text.text
    assert all(word in text.text for word in layer.split()[:20])  # the layer is kept
