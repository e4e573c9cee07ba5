"""The hard retrieval dev set generator: a one-document-per-family variant is well formed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pymupdf
import pytest

from lab.retrieval.devsets.hard_devset import build

FIELDS = {"id": str, "question": str, "doc": str, "evidence_pages": list, "family": str,
          "page_kind": str, "style": str, "image_only": bool, "multi_page": bool,
          "named": bool, "answer": str}


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    out = tmp_path_factory.mktemp("hardset")
    docs, pages, _ = build(out, seed=11, docs_per_family=1)
    return out, docs, pages


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]


def test_pdfs_open_and_page_counts_match(small_set: tuple[Path, int, int]) -> None:
    out, docs, pages = small_set
    files = sorted((out / "pdfs").glob("*.pdf"))
    assert len(files) == docs == 5
    total = 0
    for path in files:
        with pymupdf.open(path) as pdf:
            total += pdf.page_count
            assert pdf.metadata["title"]
    assert total == pages


def test_questions_have_fields_and_existing_gold_pages(small_set: tuple[Path, int, int]) -> None:
    out, _, _ = small_set
    rows = _rows(out)
    assert len(rows) >= 20
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        for name, kind in FIELDS.items():
            assert isinstance(row[name], kind), (row["id"], name)
        with pymupdf.open(out / "pdfs" / row["doc"]) as pdf:
            assert row["evidence_pages"]
            assert all(1 <= p <= pdf.page_count for p in row["evidence_pages"])
        assert row["multi_page"] == (len(row["evidence_pages"]) > 1)
    assert {r["family"] for r in rows} == {"report", "manual", "paper", "slides", "filing"}
    assert any(r["image_only"] for r in rows) and any(r["page_kind"] == "chart" for r in rows)
    assert any(not r["named"] for r in rows) and any(r["multi_page"] for r in rows)


def test_image_only_gold_pages_hold_no_answer_words(small_set: tuple[Path, int, int]) -> None:
    out, _, _ = small_set
    checked = 0
    for row in _rows(out):
        if not (row["image_only"] or row["page_kind"] == "chart"):
            continue
        words = {w for w in re.findall(r"[a-z0-9]+", row["answer"].lower())
                 if len(w) >= 3 and w not in {"eur", "million", "and"}}
        with pymupdf.open(out / "pdfs" / row["doc"]) as pdf:
            for number in row["evidence_pages"][:1]:
                page = pdf[number - 1]
                text = set(re.findall(r"[a-z0-9]+", page.get_text().lower()))
                assert page.get_images(), row["id"]
                if row["image_only"]:
                    assert not words & text, (row["id"], words & text)
                    checked += 1
    assert checked >= 5


def test_running_headers_on_only_some_documents(small_set: tuple[Path, int, int]) -> None:
    out, docs, _ = small_set
    headed = 0
    for path in (out / "pdfs").glob("*.pdf"):
        with pymupdf.open(path) as pdf:
            title = pdf.metadata["title"]
            headed += any(f"{title} - page" in page.get_text().replace("\n", " ")
                          for page in pdf)
    assert 0 < headed < docs
