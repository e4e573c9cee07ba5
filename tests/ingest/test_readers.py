"""Pages read by several reader processes come back the same as by one, in order, and the
deadline still holds."""

from __future__ import annotations

import pymupdf
import pytest

from lab.ingest.builders import image_only_page, pdf_bytes, text_pages_pdf
from worker.ingest import Deadline, IngestTimeoutError, iter_pages, ocr_available

pytestmark = pytest.mark.skipif(not ocr_available(), reason="tesseract language data missing")

SCANS = [["Minutes of the harbour board", "The dredging contract was awarded to Kessel"],
         ["Maintenance log of the Vindeby wind farm", "Turbine 7 gearbox replaced"],
         ["Warranty card", "Serial number HX-2045 registered in Tromso"]]


def _scanned_pdf() -> bytes:
    doc = pymupdf.open("pdf", text_pages_pdf(["Cover page of the scanned records of the "
                                              "harbour board and the wind farm."]))
    for lines in SCANS:
        image_only_page(doc, lines)
    return pdf_bytes(doc)


def _read(data: bytes, workers: int, **kw: object) -> list[tuple[int, str, str]]:
    return [(p.number, p.text.text, p.text.source)
            for p in iter_pages(data, dpi=40, max_pixels=10**6, ocr=True,
                                ocr_workers=workers, **kw)]  # type: ignore[arg-type]


def test_readers_read_the_same_pages_as_one() -> None:
    data = _scanned_pdf()
    alone = _read(data, 1)
    pooled = _read(data, 3)
    assert pooled == alone
    assert [source for _, _, source in pooled] == ["text_layer", "ocr", "ocr", "ocr"]
    assert "Kessel" in pooled[1][1] and "gearbox" in pooled[2][1] and "HX-2045" in pooled[3][1]


def test_readers_of_an_encrypted_document_open_it_with_its_password() -> None:
    data = _scanned_pdf()
    doc = pymupdf.open("pdf", data)
    locked = doc.tobytes(encryption=pymupdf.PDF_ENCRYPT_AES_256, owner_pw="o", user_pw="u")
    pages = list(iter_pages(locked, password="u", dpi=40, max_pixels=10**6, ocr=True,
                            ocr_workers=2))
    assert [p.text.source for p in pages] == ["text_layer", "ocr", "ocr", "ocr"]
    assert "gearbox" in pages[2].text.text


def test_deadline_still_stops_a_document_read_by_readers() -> None:
    ticks = iter(range(1000))
    deadline = Deadline(1.5, clock=lambda: float(next(ticks)))
    with pytest.raises(IngestTimeoutError) as info:
        _read(_scanned_pdf(), 2, deadline=deadline)
    assert info.value.pages_total == 4
