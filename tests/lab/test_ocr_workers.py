"""The OCR-workers benchmark runs end to end on a small scanned PDF and writes its ratios."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pymupdf
import pytest

from lab.ingest import ocr_workers
from lab.ingest.builders import image_only_page, pdf_bytes
from worker.ingest import ocr_available


@pytest.mark.skipif(not ocr_available(), reason="tesseract language data missing")
def test_benchmark_writes_median_times_and_speedups(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    doc = pymupdf.open()
    for n in range(3):
        image_only_page(doc, [f"Scanned register page {n}", "Officers and their addresses"])
    pdf = tmp_path / "scan.pdf"
    pdf.write_bytes(pdf_bytes(doc))
    out = tmp_path / "ocr.json"
    monkeypatch.setattr(sys, "argv", ["ocr_workers", "--pdf", str(pdf), "--workers", "1,2",
                                      "--rounds", "1", "--json", str(out)])
    ocr_workers.main()
    result = json.loads(out.read_text())
    assert result["pages"] == 3
    assert set(result["median_s"]) == {"1", "2"} and result["speedup_vs_first"]["1"] == 1.0
    assert result["speedup_vs_first"]["2"] > 0
