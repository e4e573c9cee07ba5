"""A small evaluation slice: two real PDFs (PyMuPDF) and four questions in MMLongBench-Doc
form, one of them "Not answerable", with testbed `family` fields."""

from __future__ import annotations

import json
from pathlib import Path

from tests.pdfs import text_pdf

QUESTIONS = [
    {"id": "q1", "doc": "valves.pdf", "question": "How often is the pressure valve inspected?",
     "answer": "14", "answer_format": "Int", "evidence_pages": [2], "doc_type": "Manual",
     "evidence_sources": ["Pure-text (Plain-text)"], "family": "lookup"},
    {"id": "q2", "doc": "valves.pdf", "question": "Which pages name the valve colours?",
     "answer": "['red', 'blue']", "answer_format": "List", "evidence_pages": [1, 3],
     "doc_type": "Manual", "evidence_sources": "['Table']", "family": "multi"},
    {"id": "q3", "doc": "revenue.pdf", "question": "By how much did revenue grow?",
     "answer": "12%", "answer_format": "Float", "evidence_pages": [1],
     "doc_type": "Financial report", "evidence_sources": ["Chart"], "family": "lookup"},
    {"id": "q4", "doc": "revenue.pdf", "question": "What was revenue in 1850?",
     "answer": "Not answerable", "answer_format": "None", "evidence_pages": [],
     "doc_type": "Financial report", "evidence_sources": []},
]


def write_slice(root: Path) -> tuple[Path, Path]:
    """Write the PDFs into root/pdfs and the questions into root/q.jsonl."""
    pdfs = root / "pdfs"
    pdfs.mkdir(parents=True)
    (pdfs / "valves.pdf").write_bytes(text_pdf([
        "Valve colours: the intake valve is red.",
        "The pressure valve is inspected every 14 days.",
        "Valve colours: the outlet valve is blue."]))
    (pdfs / "revenue.pdf").write_bytes(text_pdf([
        "Revenue grew 12% in the northern region.", "Costs fell in the south."]))
    questions = root / "q.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return pdfs, questions
