"""One behavioural suite for every `MetadataStore` (SQLite and Redis, via the `meta` fixture)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from lab.processes import start_redis
from storage.errors import ConflictError, NotFoundError, UnavailableError
from storage.metadata import (
    CollectionId,
    Document,
    DocumentId,
    Job,
    JobId,
    MetadataStore,
    Page,
    RedisMetadataStore,
    SQLiteMetadataStore,
    new_id,
)


def _doc(col: CollectionId, name: str = "a.pdf") -> Document:
    return Document(id=DocumentId(new_id("doc")), collection_id=col, filename=name,
                    sha256="0" * 64, size_bytes=123)


def _page(doc: DocumentId, number: int, page_hash: str, emb: bytes | None = None) -> Page:
    return Page(document_id=doc, number=number, page_hash=page_hash, text=f"page {number} é",
                text_source="text_layer", image_path=f"pages/{doc}/{number}.png", width=800,
                height=1000, embedding=emb, context="Caldera Foods Annual Report 2023")


def _ready(meta: MetadataStore, doc: Document, n: int) -> None:
    meta.update_progress(doc.id, status="ready", stage="done", pages_done=n, pages_total=n)


def test_collections_unique_per_tenant(meta: MetadataStore) -> None:
    a = meta.create_collection("reports", "t1")
    b = meta.create_collection("reports", "t2", shared=True)
    with pytest.raises(ConflictError):
        meta.create_collection("reports", "t1")
    assert meta.get_collection(a.id) == a
    assert meta.get_collection(b.id).shared is True
    assert meta.find_collection("reports", "t1") == a
    assert meta.find_collection("reports", "t3") is None
    time.sleep(0.002)
    c = meta.create_collection("notes", "t1")
    assert [x.id for x in meta.list_collections("t1")] == [a.id, c.id]
    assert meta.list_collections("nobody") == []
    with pytest.raises(NotFoundError):
        meta.get_collection(CollectionId("col_missing"))


def test_delete_collection_only_when_empty(meta: MetadataStore) -> None:
    col = meta.create_collection("c", "t")
    doc = _doc(col.id)
    meta.add_document(doc)
    with pytest.raises(ConflictError):
        meta.delete_collection(col.id)
    meta.delete_document(doc.id)
    meta.delete_collection(col.id)
    assert meta.find_collection("c", "t") is None
    assert meta.list_collections("t") == []
    with pytest.raises(NotFoundError):
        meta.delete_collection(col.id)
    assert meta.create_collection("c", "t").name == "c"  # the name is free again


def test_documents_and_progress(meta: MetadataStore) -> None:
    col = meta.create_collection("c", "t")
    first = _doc(col.id, "one.pdf")
    meta.add_document(first)
    time.sleep(0.002)
    second = _doc(col.id, "two.pdf")
    meta.add_document(second)
    assert meta.get_document(first.id) == first
    assert [d.filename for d in meta.list_documents(col.id)] == ["one.pdf", "two.pdf"]
    with pytest.raises(ConflictError):
        meta.add_document(first)
    with pytest.raises(NotFoundError):
        meta.add_document(_doc(CollectionId("col_missing")))
    meta.update_progress(first.id, status="failed", stage="render", pages_done=1,
                         pages_total=4, error="bad page 2")
    got = meta.get_document(first.id)
    assert (got.status, got.stage, got.pages_done, got.pages_total, got.error) == (
        "failed", "render", 1, 4, "bad page 2")
    assert got.updated_at >= first.updated_at
    with pytest.raises(NotFoundError):
        meta.update_progress(DocumentId("doc_missing"), status="ready", stage="done",
                             pages_done=0, pages_total=0)
    with pytest.raises(NotFoundError):
        meta.get_document(DocumentId("doc_missing"))


def test_put_pages_replaces_and_list_pages_filters(meta: MetadataStore) -> None:
    col = meta.create_collection("c", "t")
    a, b, pending = _doc(col.id, "a"), _doc(col.id, "b"), _doc(col.id, "pending")
    for d in (a, b, pending):
        meta.add_document(d)
        time.sleep(0.002)
    emb = bytes(range(256)) * 6
    meta.put_pages(a.id, [_page(a.id, 2, "h2"), _page(a.id, 1, "h1", emb)])
    meta.put_pages(a.id, [_page(a.id, 1, "h1", emb), _page(a.id, 2, "h3"),
                          _page(a.id, 3, "h4")])
    meta.put_pages(b.id, [_page(b.id, 1, "h3")])
    meta.put_pages(pending.id, [_page(pending.id, 1, "h9")])
    _ready(meta, a, 3)
    _ready(meta, b, 1)
    pages = meta.list_pages(col.id)
    assert [(p.document_id, p.number, p.page_hash) for p in pages] == [
        (a.id, 1, "h1"), (a.id, 2, "h3"), (a.id, 3, "h4"), (b.id, 1, "h3")]
    assert pages[0].embedding == emb and pages[1].embedding is None
    assert pages[0] == _page(a.id, 1, "h1", emb)
    assert [p.document_id for p in meta.list_pages(col.id, [b.id])] == [b.id]
    assert meta.list_pages(col.id, []) == []
    assert not meta.page_hash_in_use("h2")  # replaced away
    assert meta.page_hash_in_use("h9")  # pages of a pending document still hold references
    with pytest.raises(NotFoundError):
        meta.put_pages(DocumentId("doc_missing"), [_page(DocumentId("doc_missing"), 1, "hx")])
    assert not meta.page_hash_in_use("hx")


def test_delete_document_returns_only_orphans(meta: MetadataStore) -> None:
    col = meta.create_collection("c", "t")
    other = meta.create_collection("c", "other-tenant")
    a, b, c = _doc(col.id), _doc(col.id), _doc(other.id)
    for d in (a, b, c):
        meta.add_document(d)
    meta.put_pages(a.id, [_page(a.id, 1, "p1"), _page(a.id, 2, "p2"), _page(a.id, 3, "p3"),
                          _page(a.id, 4, "p1")])
    meta.put_pages(b.id, [_page(b.id, 1, "p2")])
    meta.put_pages(c.id, [_page(c.id, 1, "p3")])
    assert meta.delete_document(a.id) == ["p1"]
    assert [d.id for d in meta.list_documents(col.id)] == [b.id]
    assert not meta.page_hash_in_use("p1")
    assert meta.page_hash_in_use("p2") and meta.page_hash_in_use("p3")
    with pytest.raises(NotFoundError):
        meta.get_document(a.id)
    with pytest.raises(NotFoundError):
        meta.delete_document(a.id)
    assert meta.delete_document(b.id) == ["p2"]
    assert meta.delete_document(c.id) == ["p3"]
    assert meta.list_pages(col.id) == []


def test_jobs(meta: MetadataStore) -> None:
    job = Job(id=JobId(new_id("job")), kind="ingest", document_id=DocumentId("doc_x"))
    meta.add_job(job)
    assert meta.get_job(job.id) == job
    with pytest.raises(ConflictError):
        meta.add_job(job)
    meta.update_job(job.id, status="failed", error="boom")
    got = meta.get_job(job.id)
    assert (got.status, got.error, got.kind, got.document_id) == ("failed", "boom", "ingest",
                                                                  "doc_x")
    answer = Job(id=JobId(new_id("job")), kind="answer")
    meta.add_job(answer)
    assert meta.get_job(answer.id).document_id is None
    with pytest.raises(NotFoundError):
        meta.update_job(JobId("job_missing"), status="running")
    with pytest.raises(NotFoundError):
        meta.get_job(JobId("job_missing"))


def test_redis_metadata_store_down_raises_unavailable(tmp_path: Path) -> None:
    url, stop = start_redis(tmp_path)
    store = RedisMetadataStore(url, attempts=2)
    col = store.create_collection("c", "t")
    stop()
    with pytest.raises(UnavailableError):
        store.get_collection(col.id)
    store.close()


def test_sqlite_store_opens_a_database_written_before_pages_had_a_context(
        tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE pages (
            document_id TEXT NOT NULL, number INTEGER NOT NULL, page_hash TEXT NOT NULL,
            text TEXT NOT NULL, text_source TEXT NOT NULL, image_path TEXT NOT NULL,
            width INTEGER NOT NULL, height INTEGER NOT NULL, embedding BLOB,
            PRIMARY KEY (document_id, number));
        INSERT INTO pages VALUES ('doc_old', 1, 'h1', 'old text', 'ocr', 'p.png', 8, 9, NULL);
    """)
    old.commit()
    old.close()
    meta = SQLiteMetadataStore(path)
    col = meta.create_collection("c", "t")
    doc = _doc(col.id)
    meta.add_document(doc)
    meta.put_pages(doc.id, [_page(doc.id, 1, "h2")])
    _ready(meta, doc, 1)
    assert meta.list_pages(col.id) == [_page(doc.id, 1, "h2")]
    rows = meta._all("SELECT context FROM pages WHERE document_id = 'doc_old'", ())
    assert [r["context"] for r in rows] == [""]  # older pages read as "no context"
