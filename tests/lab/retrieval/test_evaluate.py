"""The retrieval eval end to end on a tiny generated folder of PDFs."""

from __future__ import annotations

import json
from pathlib import Path

import pymupdf
import pytest

from lab.ingest.builders import image_only_page, pdf_bytes, text_pages_pdf
from lab.retrieval.evaluate import (
    ingest_corpus,
    load_questions,
    run_retrieval_eval,
)
from worker.ingest import ocr_available
from worker.retrieval import Embedder
from worker.retrieval.document_context import document_context

HARBOUR = [
    "Harbour authority annual review. Ferry traffic and cargo volumes for the year.",
    "The northern breakwater was rebuilt with granite blocks quarried in Aberdeen.",
    "Pilotage fees rose by four percent; tug services were tendered again.",
]
SCAN = ["Maintenance log of the Vindeby wind farm", "Turbine 7 gearbox replaced in March",
        "Blade inspection found erosion on turbine 3"]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    """all-MiniLM-L6-v2 from the pip package, offline."""
    return Embedder()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("evalset")
    pdfs = root / "pdfs"
    pdfs.mkdir()
    (pdfs / "harbour.pdf").write_bytes(text_pages_pdf(HARBOUR))
    doc = pymupdf.open("pdf", text_pages_pdf(["Wind farm operations report, cover page of "
                                              "the turbine maintenance file for Vindeby."]))
    image_only_page(doc, SCAN)
    (pdfs / "windfarm.pdf").write_bytes(pdf_bytes(doc))
    (pdfs / "notes.pdf").write_bytes(b"these are plain notes, not a PDF\n")
    rows = [
        {"id": "q1", "question": "What stone was used to rebuild the breakwater?",
         "doc": "harbour.pdf", "evidence_pages": [2]},
        {"id": "q2", "question": "Which turbine had its gearbox replaced?",
         "doc": "windfarm", "evidence_pages": "[2]"},
        {"id": "q3", "question": "How much did pilotage fees rise?", "doc": "harbour.pdf",
         "evidence_pages": [3]},
        {"id": "q4", "question": "Is there anything about bakeries?", "doc": "harbour.pdf"},
    ]
    (root / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.skipif(not ocr_available(), reason="tesseract language data missing")
def test_eval_over_the_collection(folder: Path, embedder: Embedder) -> None:
    out = folder / "preds.jsonl"
    summary = run_retrieval_eval(folder / "pdfs", folder / "questions.jsonl", out, [1, 3],
                                 within_doc=False, embedder=embedder)
    preds = read_jsonl(out)
    assert [p["id"] for p in preds] == ["q1", "q2", "q3", "q4"]
    for p in preds:  # all 5 pages (fewer than 20), ranked, as [file, 1-based page]
        assert len(p["retrieved"]) == 5
        assert sorted(map(tuple, p["retrieved"])) == sorted(
            [("harbour.pdf", n) for n in (1, 2, 3)] + [("windfarm.pdf", n) for n in (1, 2)])
    assert preds[0]["retrieved"][0] == ["harbour.pdf", 2]
    assert preds[1]["retrieved"][0] == ["windfarm.pdf", 2]  # only OCR can read that page
    assert preds[2]["retrieved"][0] == ["harbour.pdf", 3]
    assert summary["documents"] == 2 and summary["pages"] == 5 and summary["ocr_pages"] == 1
    assert summary["scored_questions"] == 3
    assert summary["page_recall"] == {"1": 1.0, "3": 1.0}
    assert summary["doc_hit"] == {"1": 1.0, "3": 1.0}
    assert "notes.pdf" in summary["failed_documents"]


def test_eval_within_doc_and_without_ocr(folder: Path, embedder: Embedder) -> None:
    out = folder / "preds_doc.jsonl"
    summary = run_retrieval_eval(folder / "pdfs", folder / "questions.jsonl", out, [1],
                                 within_doc=True, ocr=False, embedder=embedder)
    preds = read_jsonl(out)
    assert {d for d, _ in preds[0]["retrieved"]} == {"harbour.pdf"}
    assert {d for d, _ in preds[1]["retrieved"]} == {"windfarm.pdf"}
    assert len(preds[1]["retrieved"]) == 2
    # without OCR the scanned page has no text: its question misses at rank 1
    assert preds[1]["retrieved"][0] == ["windfarm.pdf", 1]
    assert summary["ocr_pages"] == 0
    assert summary["page_recall"] == {"1": pytest.approx(2 / 3, abs=1e-3)}


def test_within_doc_needs_a_doc(folder: Path, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "x", "question": "breakwater"}) + "\n")
    with pytest.raises(ValueError, match="within-doc"):
        run_retrieval_eval(folder / "pdfs", questions, tmp_path / "p.jsonl", [1],
                           within_doc=True, ocr=False, dense_weight=0.0)


def test_bm25_only_eval_needs_no_embedder(folder: Path, tmp_path: Path) -> None:
    summary = run_retrieval_eval(folder / "pdfs", folder / "questions.jsonl",
                                 tmp_path / "p.jsonl", [1, 2], within_doc=False, ocr=False,
                                 dense_weight=0.0)
    assert summary["page_recall"]["1"] == pytest.approx(2 / 3, abs=1e-3)


def test_load_questions_accepts_mmlongbench_style_fields(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "q?", "doc_id": "a.pdf",
                                "evidence_pages": "[3, 5]"}) + "\n\n")
    (q,) = load_questions(path)
    assert (q.id, q.doc, q.evidence_pages) == ("1", "a.pdf", (3, 5))


@pytest.mark.skipif(not ocr_available(), reason="tesseract language data missing")
def test_worker_processes_read_the_same_corpus_as_one_process(folder: Path) -> None:
    alone = ingest_corpus(folder / "pdfs", ocr=True, embedder=None, workers=1)
    pooled = ingest_corpus(folder / "pdfs", ocr=True, embedder=None, workers=2)
    assert pooled.pages == alone.pages and pooled.failed == alone.failed
    assert [p.source for p in alone.pages].count("ocr") == 1
    # every page carries its document's title words (the cover's first words, the file name)
    assert {p.context for p in alone.pages if p.doc == "windfarm.pdf"} == {
        document_context("windfarm.pdf", None, alone.pages[3].text)}
    assert "Wind farm operations report" in alone.pages[3].context
