"""What the C libraries write to stderr while pages are read (MuPDF, Tesseract and
Leptonica) reaches the application log at debug level, never the terminal."""

from __future__ import annotations

import logging

import pymupdf
import pytest

from lab.ingest.bad_pdfs import flip_content_bytes, leptonica_noise_page, paper_pdf
from worker.ingest import iter_pages


def test_native_messages_go_to_the_debug_log_not_to_stderr(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    data = flip_content_bytes(paper_pdf(3), [2])
    with caplog.at_level(logging.DEBUG, logger="worker.ingest.native"):
        pages = list(iter_pages(data, dpi=30, max_pixels=10**6, ocr=False))
    assert [p.error is None for p in pages] == [True, False, True]
    out, err = capfd.readouterr()
    assert "MuPDF" not in out + err and "zlib" not in out + err
    native = [r for r in caplog.records if r.name == "worker.ingest.native"]
    assert native and all(r.levelno == logging.DEBUG for r in native)
    assert any("page 2" in r.getMessage() and "zlib error" in r.getMessage() for r in native)


def test_tesseract_and_leptonica_messages_go_to_the_debug_log_not_to_stderr(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    doc = pymupdf.open()
    leptonica_noise_page(doc)
    with caplog.at_level(logging.DEBUG, logger="worker.ingest.native"):
        pages = list(iter_pages(doc.tobytes(), dpi=30, max_pixels=10**6, ocr=True))
    assert [p.error for p in pages] == [None] and "harbour" in pages[0].text.text
    out, err = capfd.readouterr()
    assert "too small" not in out + err and "cannot be recognized" not in out + err
    native = [r.getMessage() for r in caplog.records if r.name == "worker.ingest.native"]
    assert any("page 1" in m and "Image too small to scale" in m for m in native), native
