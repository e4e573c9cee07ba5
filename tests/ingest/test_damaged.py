"""Damaged files are read page by page (issue 18): a page that cannot be read is reported, the
others are ingested; a file without its trailer is read whole; a truncated one is refused."""

from __future__ import annotations

import pymupdf
import pytest

from lab.ingest.bad_pdfs import bit_rot, flip_content_bytes, paper_pdf, without_trailer
from worker.ingest import (
    CorruptPdfError,
    IngestError,
    UnreadableDocumentError,
    check_readable,
    iter_pages,
    open_pdf,
)
from worker.ingest.pdf import looks_truncated


def _read(data: bytes, **kw: object) -> list:  # type: ignore[type-arg]
    return list(iter_pages(data, dpi=30, max_pixels=10**6, ocr=False, **kw))  # type: ignore[arg-type]


def test_flipped_bytes_cost_only_their_pages() -> None:
    data = flip_content_bytes(paper_pdf(14), [3, 9])
    with open_pdf(data, max_pages=50) as doc:
        assert doc.page_count == 14
    pages = _read(data, ocr_workers=2)
    assert [p.number for p in pages] == list(range(1, 15))
    bad = [p for p in pages if p.error]
    assert [p.number for p in bad] == [3, 9]
    assert all(p.image is None and p.text.text == "" for p in bad)
    assert all("error" in (p.error or "") for p in bad), [p.error for p in bad]
    good = [p for p in pages if not p.error]
    assert all(f"page {p.number} of the survey" in p.text.text for p in good)
    check_readable(14, bad, truncated=False)  # ready without them


def test_bit_rot_every_4_kib_never_escapes_as_an_internal_error() -> None:
    data = bit_rot(paper_pdf(14))
    try:
        with open_pdf(data, max_pages=50) as doc:
            truncated = looks_truncated(doc, data)
    except IngestError as exc:  # refused whole: with a message for the user
        assert exc.message.endswith(".")
        return
    pages = _read(data)
    assert [p.number for p in pages] == list(range(1, 15))
    bad = [p for p in pages if p.error]
    try:
        check_readable(14, bad, truncated)
    except IngestError as exc:
        assert exc.message.endswith(".")
    else:
        assert any(p.image is not None for p in pages)


def test_a_file_without_its_trailer_is_read_whole() -> None:
    data = without_trailer(paper_pdf(3))
    assert b"%%EOF" not in data and b"trailer" not in data
    with open_pdf(data, max_pages=10) as doc:
        assert doc.is_repaired and doc.page_count == 3
        assert looks_truncated(doc, data)
    pages = _read(data)
    assert [p.error for p in pages] == [None, None, None]
    assert "page 3 of the survey" in pages[2].text.text


def test_a_file_cut_inside_its_last_pages_is_refused() -> None:
    doc = pymupdf.open("pdf", paper_pdf(8))
    data = doc.tobytes(garbage=0, deflate=False)  # page objects in page order
    with pytest.raises(CorruptPdfError) as info:
        open_pdf(data[: len(data) // 2], max_pages=10)
    assert "truncated" in info.value.message and "of 8" in info.value.message


def test_a_truncated_file_whose_last_page_draws_blank_fails_at_ingest() -> None:
    doc = pymupdf.open("pdf", paper_pdf(8))
    full = doc.tobytes(garbage=0, deflate=True)
    last = pymupdf.open("pdf", full)
    xref = int(last.xref_get_key(last.page_xref(7), "Contents")[1].strip("[]").split()[0])
    # cut inside the last page's content stream: the page object survives
    cut = full[: full.index(b"\n%d 0 obj" % xref) + 60]
    with open_pdf(cut, max_pages=10) as opened:
        truncated = looks_truncated(opened, cut)
        total = opened.page_count
    pages = _read(cut)
    bad = [p for p in pages if p.error]
    assert truncated and total == 8 and [p.number for p in bad] == [8]
    with pytest.raises(CorruptPdfError) as info:
        check_readable(total, bad, truncated)
    assert "pages 8 to 8 of 8 cannot be read" in info.value.message


def test_a_document_with_no_readable_page_fails() -> None:
    data = flip_content_bytes(paper_pdf(2), [1, 2])
    bad = [p for p in _read(data) if p.error]
    with pytest.raises(UnreadableDocumentError) as info:
        check_readable(2, bad, truncated=False)
    assert info.value.message.startswith("None of the 2 pages could be read (page 1: ")
