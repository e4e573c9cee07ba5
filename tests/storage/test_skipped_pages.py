"""A document's unreadable pages are recorded on it, in SQLite and in Redis (issue 18)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage.metadata import (
    Document,
    DocumentId,
    MetadataStore,
    SkippedPage,
    SQLiteMetadataStore,
    new_id,
)


def _new_doc(meta: MetadataStore) -> Document:
    col = meta.create_collection("papers", "tenant-a")
    doc = Document(id=DocumentId(new_id("doc")), collection_id=col.id, filename="rot.pdf",
                   sha256="0" * 64, size_bytes=10)
    meta.add_document(doc)
    return doc


def test_skipped_pages_round_trip(meta: MetadataStore) -> None:
    doc = _new_doc(meta)
    assert meta.get_document(doc.id).skipped_pages == []
    skipped = [SkippedPage(3, "zlib error: invalid distance too far back"),
               SkippedPage(9, "its content is missing from the file")]
    meta.update_progress(doc.id, status="ready", stage="done", pages_done=14, pages_total=14,
                         skipped_pages=skipped)
    got = meta.get_document(doc.id)
    assert (got.status, got.skipped_pages) == ("ready", skipped)
    assert meta.list_documents(doc.collection_id)[0].skipped_pages == skipped
    # progress updates without the argument keep what was recorded
    meta.update_progress(doc.id, status="ready", stage="done", pages_done=14, pages_total=14)
    assert meta.get_document(doc.id).skipped_pages == skipped
    meta.update_progress(doc.id, status="processing", stage="render", pages_done=0,
                         pages_total=14, skipped_pages=[])
    assert meta.get_document(doc.id).skipped_pages == []


def test_an_older_database_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE collections (id TEXT PRIMARY KEY, name TEXT NOT NULL, tenant TEXT NOT NULL,
            shared INTEGER NOT NULL, created_at REAL NOT NULL, UNIQUE (tenant, name));
        CREATE TABLE documents (id TEXT PRIMARY KEY, collection_id TEXT NOT NULL,
            filename TEXT NOT NULL, sha256 TEXT NOT NULL, size_bytes INTEGER NOT NULL,
            status TEXT NOT NULL, stage TEXT NOT NULL, pages_done INTEGER NOT NULL,
            pages_total INTEGER NOT NULL, error TEXT, job_id TEXT,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        INSERT INTO collections VALUES ('col_1', 'old', 't', 0, 1.0);
        INSERT INTO documents VALUES ('doc_1', 'col_1', 'a.pdf', 'x', 1, 'ready', 'done', 2, 2,
            NULL, NULL, 1.0, 1.0);
    """)
    conn.commit()
    conn.close()
    store = SQLiteMetadataStore(path)
    try:
        assert store.get_document(DocumentId("doc_1")).skipped_pages == []
    finally:
        store.close()
