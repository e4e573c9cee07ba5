"""`retrieve` answers from the collection's index once it exists: a missing index is built in
the background while the scan path answers, ingest and delete hooks keep it current, and the
answer path reads only the top-k pages from the store."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from storage.metadata import CollectionId, DocumentId, Page, SQLiteMetadataStore
from tests.retrieval.index_corpus import make_documents, store_document
from worker.answer_job import Question, retrieve
from worker.context import build_context
from worker.retrieval import Embedder
from worker.retrieval.index.pipeline import (
    on_document_deleted,
    on_document_ready,
    retrieval_indexes,
    start_index_check,
)
from worker.settings import Settings


class CountingStore(SQLiteMetadataStore):
    """The real SQLite store, counting the calls of the question's thread that read every
    page of a scope (background rebuilds read pages too, in their own threads)."""

    list_pages_calls = 0

    def list_pages(self, collection_id: CollectionId,
                   document_ids: Sequence[DocumentId] | None = None) -> list[Page]:
        """Count, then list as usual."""
        if threading.current_thread() is threading.main_thread():
            self.list_pages_calls += 1
        return super().list_pages(collection_id, document_ids)


def _wait_for_rebuilds() -> None:
    """Join the check and rebuild threads until none is left (the check starts rebuilds)."""
    while busy := [t for t in threading.enumerate()
                   if t.name.startswith(("index-rebuild-", "index-check"))]:
        for thread in busy:
            thread.join(timeout=60)


def test_retrieve_uses_the_index_and_falls_back_to_scanning(
        tmp_path: Path, embedder: Embedder) -> None:
    ctx = build_context(Settings(home=tmp_path))
    ctx.meta.close()
    store = CountingStore(tmp_path / "metadata.sqlite3")
    ctx.meta = store
    docs = make_documents(embedder, n_docs=10, pages=4)
    collection = store.create_collection("c", "tenant")
    for doc_id, _, pages in docs[:8]:
        store_document(store, collection.id, doc_id, pages)
    q = Question(collection_id=collection.id, question="dividend outlook for shareholders",
                 top_k=5, max_new_tokens=1)
    scanned = retrieve(ctx, q)  # no index yet: scan, and build it in the background
    assert store.list_pages_calls == 1
    _wait_for_rebuilds()
    check = retrieval_indexes(ctx).check(store, collection.id)
    assert check.state == "ok", check
    indexed = retrieve(ctx, q)
    assert store.list_pages_calls == 1  # the index answered; only top-k pages were read
    assert [p.document_id for p, _ in indexed][:1] == [p.document_id for p, _ in scanned][:1]
    assert all(p.text for p, _ in indexed)

    for doc_id, _, pages in docs[8:]:  # ingestion's ready transition, then the hook
        store_document(store, collection.id, doc_id, pages)
        on_document_ready(ctx, collection.id, doc_id, pages)
    target = docs[8][0]
    scoped = retrieve(ctx, Question(collection_id=collection.id, question="anything", top_k=3,
                                    max_new_tokens=1, document_ids=[DocumentId(target)]))
    assert {p.document_id for p, _ in scoped} == {target}
    store.delete_document(DocumentId(target))
    on_document_deleted(ctx, collection.id, target)
    check = retrieval_indexes(ctx).check(store, collection.id)
    assert check.state == "ok", check
    after = retrieve(ctx, Question(collection_id=collection.id, question="turbine rotor",
                                   top_k=40, max_new_tokens=1))
    assert target not in {p.document_id for p, _ in after}
    assert store.list_pages_calls == 1

    store.delete_document(DocumentId(docs[0][0]))  # a delete the index never heard of
    start_index_check(ctx)  # what the API does at startup
    _wait_for_rebuilds()
    check = retrieval_indexes(ctx).check(store, collection.id)
    assert check.state == "ok", check
    ctx.close()


def test_index_and_scan_rank_with_the_cleaned_question(tmp_path: Path,
                                                       embedder: Embedder) -> None:
    style = Page(document_id=DocumentId("doc_style"), number=1, page_hash="h_style",
                 text="Write each answer in list format, in alphabetical order; an answer "
                 "in another format goes back to its writer.", text_source="text_layer",
                 image_path="pages/doc_style/0.png", width=10, height=10, context="style guide")
    question = ("What is the dividend outlook for shareholders? Please write the answer in "
                "list format with alphabetical order.")

    def top_document(clean: bool) -> tuple[str, str]:
        home = tmp_path / str(clean)
        ctx = build_context(Settings(home=home, clean_queries=clean))
        collection = ctx.meta.create_collection("c", "tenant")
        for doc_id, _, pages in make_documents(embedder, n_docs=5, pages=2):
            store_document(ctx.meta, collection.id, doc_id, pages)
        store_document(ctx.meta, collection.id, "doc_style", [style])
        q = Question(collection_id=collection.id, question=question, top_k=1,
                     max_new_tokens=1, dense_weight=0.0)
        scanned = retrieve(ctx, q)[0][0].document_id  # no index yet: the scan answers
        _wait_for_rebuilds()
        assert retrieval_indexes(ctx).check(ctx.meta, collection.id).state == "ok"
        indexed = retrieve(ctx, q)[0][0].document_id
        ctx.close()
        return scanned, indexed

    assert top_document(clean=False) == ("doc_style", "doc_style")  # instruction words win
    assert top_document(clean=True) == ("doc_001_finance", "doc_001_finance")
