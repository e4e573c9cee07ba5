"""Retrieval evaluation: ingest a folder of PDFs (text, OCR, embeddings; no VLM), rank pages
for every question, write the rankings as JSONL and score them against gold pages.

Questions JSONL: one object per line with `id`, `question`, optional `doc` (a file name in
the folder, with or without `.pdf`) and optional `evidence_pages` (1-based page numbers, a
list or a string such as "[3, 5]", the form MMLongBench-Doc uses). Predictions JSONL: one
line per question, `{"id": ..., "retrieved": [["file.pdf", page], ...]}` best first, at
least `depth` entries (all pages of the scope when it has fewer).

Metrics over questions that have a `doc` and at least one evidence page:
`page_recall@k` (share of gold pages in the top k, averaged), `page_hit@k` (at least one
gold page in the top k) and `doc_hit@k` (at least one of the top k from the gold document).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from worker.ingest import IngestError, TextSource, iter_pages, open_pdf
from worker.retrieval.document_context import document_context
from worker.retrieval.embedder import Embedder
from worker.retrieval.fusion import DEFAULT_RRF_K
from worker.retrieval.hybrid import Candidate, search
from worker.retrieval.passages import DEFAULT_PASSAGES, PassageConfig, embed_pages

log = logging.getLogger(__name__)

PageRef = tuple[str, int]  # (file name, 1-based page)
MAX_EVAL_PAGES = 100_000


@dataclass
class CorpusPage:
    """One ingested page of the evaluation corpus."""

    doc: str
    page: int
    text: str
    source: TextSource
    embedding: np.ndarray | None = None
    context: str = ""  # the document's title words (`document_context`)


@dataclass
class Corpus:
    """Every page of every PDF in a folder, and the files that could not be ingested."""

    pages: list[CorpusPage]
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def documents(self) -> list[str]:
        """File names with at least one page, in corpus order."""
        return list(dict.fromkeys(p.doc for p in self.pages))


@dataclass(frozen=True)
class EvalQuestion:
    """A question, the document it is about (if known) and its gold pages (may be empty)."""

    id: str
    question: str
    doc: str | None
    evidence_pages: tuple[int, ...]


def load_questions(path: Path) -> list[EvalQuestion]:
    """Parse a questions JSONL file (see the module docstring)."""
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "question" not in row:
            raise ValueError(f"{path}:{number}: a question line needs a 'question' field")
        pages = row.get("evidence_pages") or []
        if isinstance(pages, str):
            pages = json.loads(pages) if pages.strip() else []
        questions.append(EvalQuestion(
            id=str(row.get("id", number)), question=str(row["question"]),
            doc=row.get("doc") or row.get("doc_id"),
            evidence_pages=tuple(int(p) for p in pages),
        ))
    return questions


def ingest_corpus(
    pdfs_dir: Path, *, ocr: bool, embedder: Embedder | None,
    passages: PassageConfig = DEFAULT_PASSAGES,
    workers: int | None = None,
) -> Corpus:
    """Read the text (layer or OCR) of every `*.pdf` in `pdfs_dir` and embed it.

    Documents are read by `workers` processes (default: one per CPU; 1 reads them in this
    process), since OCR dominates and MuPDF is not thread-safe; they travel back as JSON.
    A file that fails to open is recorded in `Corpus.failed` with its user-facing message.
    With `embedder` None, pages get no embeddings (BM25-only evaluation).
    """
    started = time.perf_counter()
    corpus = Corpus(pages=[])
    paths = sorted(pdfs_dir.glob("*.pdf"))
    count = min(workers or os.cpu_count() or 1, max(len(paths), 1))
    read = functools.partial(_read_document, ocr=ocr)
    with contextlib.ExitStack() as stack:
        if count > 1:
            pool = stack.enter_context(ProcessPoolExecutor(
                count, mp_context=multiprocessing.get_context("spawn")))
            results = pool.map(read, [str(p) for p in paths])
        else:
            results = map(read, [str(p) for p in paths])
        for path, result in zip(paths, results, strict=True):
            data = json.loads(result)
            if "error" in data:
                log.warning("skipping %s: %s", path.name, data["error"])
                corpus.failed[path.name] = data["error"]
                continue
            context = document_context(path.name, data["title"],
                                       data["pages"][0][1] if data["pages"] else "")
            corpus.pages.extend(CorpusPage(path.name, number, text, source, context=context)
                                for number, text, source in data["pages"])
    if embedder is not None:
        matrices = embed_pages([p.text for p in corpus.pages], embedder, passages,
                               contexts=[p.context for p in corpus.pages])
        for page, matrix in zip(corpus.pages, matrices, strict=True):
            page.embedding = matrix
    corpus.seconds = time.perf_counter() - started
    return corpus


def _read_document(path: str, *, ocr: bool) -> str:
    """One PDF's title and pages `[number, text, source]` (or its ingest error) as JSON."""
    try:
        data = Path(path).read_bytes()
        with open_pdf(data, max_pages=MAX_EVAL_PAGES) as doc:
            title = (doc.metadata or {}).get("title")
        pages = [[item.number, item.text.text, item.text.source]
                 for item in iter_pages(data, dpi=72, max_pixels=10**7, ocr=ocr, render=False)
                 if item.error is None]
    except IngestError as exc:
        return json.dumps({"error": exc.message})
    return json.dumps({"title": title, "pages": pages})


def _resolve_doc(name: str | None, documents: Sequence[str]) -> str | None:
    if name is None:
        return None
    if name in documents:
        return name
    stem = name[:-4] if name.lower().endswith(".pdf") else name
    return next((d for d in documents if d[:-4] == stem), None)


def rank_questions(
    corpus: Corpus, questions: Sequence[EvalQuestion], *, within_doc: bool, depth: int = 20,
    bm25_weight: float = 1.0, dense_weight: float = 1.0, embedder: Embedder | None = None,
    rrf_k: float = DEFAULT_RRF_K, ref_weight: float = 0.0, clean_query: bool = True,
) -> list[list[PageRef]]:
    """Ranked pages per question (at most `depth`, fewer only when the scope is smaller).
    The weights and `clean_query` are `hybrid.search`'s.

    With `within_doc`, each question's candidates are the pages of its `doc`; a question
    without a `doc`, or whose doc is not in the folder, raises `ValueError`.
    """
    documents = corpus.documents()
    all_candidates = [Candidate(key=str(i), text=p.text, embedding=p.embedding, context=p.context,
                                document=p.doc, page=p.page)
                      for i, p in enumerate(corpus.pages)]
    by_doc: dict[str, list[Candidate]] = {}
    for candidate, page in zip(all_candidates, corpus.pages, strict=True):
        by_doc.setdefault(page.doc, []).append(candidate)
    rankings: list[list[PageRef]] = []
    for q in questions:
        candidates = all_candidates
        if within_doc:
            doc = _resolve_doc(q.doc, documents)
            if doc is None:
                failed = q.doc is not None and _resolve_doc(q.doc, list(corpus.failed))
                if failed:  # the document could not be ingested: nothing to retrieve
                    rankings.append([])
                    continue
                raise ValueError(f"question {q.id!r}: --within-doc needs a 'doc' that is one "
                                 f"of the PDFs in the folder (got {q.doc!r})")
            candidates = by_doc[doc]
        hits = search(q.question, candidates, top_k=depth, bm25_weight=bm25_weight,
                      dense_weight=dense_weight, embedder=embedder, rrf_k=rrf_k,
                      ref_weight=ref_weight, clean_query=clean_query)
        rankings.append([(corpus.pages[int(h.key)].doc, corpus.pages[int(h.key)].page)
                         for h in hits])
    return rankings


def score_rankings(
    corpus: Corpus, questions: Sequence[EvalQuestion], rankings: Sequence[Sequence[PageRef]],
    ks: Sequence[int],
) -> dict[str, object]:
    """Page recall@k, page hit@k and document hit@k over the questions with gold pages."""
    documents = corpus.documents() + list(corpus.failed)
    recall = {k: [] for k in ks}  # type: dict[int, list[float]]
    page_hit = {k: [] for k in ks}  # type: dict[int, list[float]]
    doc_hit = {k: [] for k in ks}  # type: dict[int, list[float]]
    for q, ranked in zip(questions, rankings, strict=True):
        doc = _resolve_doc(q.doc, documents)
        if doc is None or not q.evidence_pages:
            continue
        gold = {(doc, p) for p in q.evidence_pages}
        for k in ks:
            top = list(ranked[:k])
            found = len(gold.intersection(top))
            recall[k].append(found / len(gold))
            page_hit[k].append(float(found > 0))
            doc_hit[k].append(float(any(d == doc for d, _ in top)))
    scored = len(recall[ks[0]]) if ks else 0

    def mean(values: dict[int, list[float]]) -> dict[str, float | None]:
        return {str(k): (round(float(np.mean(v)), 4) if v else None) for k, v in values.items()}

    return {"scored_questions": scored, "page_recall": mean(recall),
            "page_hit": mean(page_hit), "doc_hit": mean(doc_hit)}


def write_predictions(out: Path, questions: Sequence[EvalQuestion],
                      rankings: Sequence[Sequence[PageRef]]) -> None:
    """One JSON line per question: `{"id": ..., "retrieved": [[file, page], ...]}`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for q, ranked in zip(questions, rankings, strict=True):
            fh.write(json.dumps({"id": q.id, "retrieved": [[d, p] for d, p in ranked]}) + "\n")


def run_retrieval_eval(
    pdfs_dir: Path, questions: Path, out: Path, ks: list[int], within_doc: bool,
    ocr: bool = True, *, bm25_weight: float = 1.0, dense_weight: float = 0.6,
    rrf_k: float = DEFAULT_RRF_K, embedder: Embedder | None = None, depth: int = 20,
    ref_weight: float = 0.0, clean_query: bool = True,
) -> dict[str, object]:
    """Ingest `pdfs_dir`, rank pages for every question, write `out`, return the summary.

    The summary holds corpus counts (documents, pages, pages read by OCR, failed files),
    timings, and the metrics of `score_rankings` at each k in `ks` (metrics are computed
    only over questions with a `doc` and evidence pages). `embedder` defaults to the
    shared all-MiniLM-L6-v2 one when `dense_weight` is not 0.
    """
    if not ks or min(ks) < 1:
        raise ValueError("ks must be positive integers")
    if dense_weight and embedder is None:
        embedder = Embedder()
    items = load_questions(questions)
    corpus = ingest_corpus(pdfs_dir, ocr=ocr, embedder=embedder if dense_weight else None)
    started = time.perf_counter()
    rankings = rank_questions(corpus, items, within_doc=within_doc,
                              depth=max(depth, max(ks)), bm25_weight=bm25_weight,
                              dense_weight=dense_weight, embedder=embedder, rrf_k=rrf_k,
                              ref_weight=ref_weight, clean_query=clean_query)
    rank_seconds = time.perf_counter() - started
    write_predictions(out, items, rankings)
    summary: dict[str, object] = {
        "documents": len(corpus.documents()),
        "pages": len(corpus.pages),
        "ocr_pages": sum(p.source == "ocr" for p in corpus.pages),
        "failed_documents": corpus.failed,
        "questions": len(items),
        "ocr": ocr,
        "within_doc": within_doc,
        "bm25_weight": bm25_weight,
        "dense_weight": dense_weight,
        "rrf_k": rrf_k,
        "ref_weight": ref_weight,
        "clean_query": clean_query,
        "ingest_s": round(corpus.seconds, 2),
        "rank_s_per_question": round(rank_seconds / max(len(items), 1), 4),
    }
    summary.update(score_rankings(corpus, items, rankings, ks))
    return summary

