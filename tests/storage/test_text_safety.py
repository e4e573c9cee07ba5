"""Every string the metadata stores keep or hand back is valid UTF-8 (issue 30, point 6).

MuPDF's message for a damaged page can carry undecodable bytes as lone surrogates
(`unknown keyword: '0\\x19\\udcc6T'`); stored in `skipped_pages`, it made every read of the
document, and of its collection's listing, a 500. Text is repaired on write, and records written
before the fix are repaired on read, in both stores.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import redis

from service.views import document_out, job_out
from storage.metadata import (
    Document,
    DocumentId,
    Job,
    JobId,
    MetadataStore,
    Page,
    RedisMetadataStore,
    SkippedPage,
    SQLiteMetadataStore,
    new_id,
)
from storage.text_safety import safe_text, safe_value

MUPDF = "unknown keyword: '0\x19\udcc6T\udcff'"  # as MuPDF's message reaches Python
REPAIRED = "unknown keyword: '0\x19\\xc6T\\xff'"


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_safe_text_escapes_lone_surrogates_and_keeps_valid_text() -> None:
    assert safe_text(MUPDF) == REPAIRED
    assert safe_text("a\ud800b\udfffc") == "a\\ud800b\\udfffc"
    valid = "Résumé \U0001F600 \x00 tab\t"
    assert safe_text(valid) is valid
    assert safe_value({"k\udcc6": [MUPDF, ("x\udcc6", 3)], "n": None, "b": b"\xc6"}) == \
        {"k\\xc6": [REPAIRED, ("x\\xc6", 3)], "n": None, "b": b"\xc6"}


def _document(meta: MetadataStore, filename: str = "a.pdf") -> Document:
    col = meta.create_collection("fuzzed", "tenant-a")
    doc = Document(id=DocumentId(new_id("doc")), collection_id=col.id, filename=filename,
                   sha256="0" * 64, size_bytes=10, job_id=JobId(new_id("job")))
    meta.add_job(Job(id=doc.job_id, kind="ingest", document_id=doc.id))  # type: ignore[arg-type]
    meta.add_document(doc)
    return doc


def test_text_with_lone_surrogates_is_stored_repaired(meta: MetadataStore) -> None:
    """Before: SQLite refused the write (`surrogates not allowed`), Redis kept the surrogates
    and every later read failed to encode."""
    doc = _document(meta, filename="scan\udcc6.pdf")
    assert doc.job_id is not None
    meta.update_progress(doc.id, status="ready", stage="done", pages_done=2, pages_total=2,
                         error=f"damaged: {MUPDF}", skipped_pages=[SkippedPage(2, MUPDF)])
    meta.put_pages(doc.id, [Page(document_id=doc.id, number=1, page_hash="h1",
                                 text=f"text {MUPDF}", text_source="text_layer",
                                 image_path="pages/x/1.png", width=10, height=10,
                                 context="title\udcc6")])
    meta.update_job(doc.job_id, status="failed", error=MUPDF)
    got = meta.get_document(doc.id)
    assert got.filename == "scan\\xc6.pdf" and got.error == f"damaged: {REPAIRED}"
    assert got.skipped_pages == [SkippedPage(2, REPAIRED)]
    assert meta.list_documents(doc.collection_id)[0] == got
    (page,) = meta.list_pages(doc.collection_id)
    assert (page.text, page.context) == (f"text {REPAIRED}", "title\\xc6")
    assert meta.get_pages([(doc.id, 1)]) == [page]
    assert meta.get_job(doc.job_id).error == REPAIRED
    document_out(got).model_dump_json()  # the API's reply encodes


def _check_repaired(meta: MetadataStore, doc: Document) -> None:
    got = meta.get_document(doc.id)
    listed = meta.list_documents(doc.collection_id)
    assert listed == [got]
    assert got.skipped_pages == [SkippedPage(3, REPAIRED)]
    assert _valid(got.filename) and _valid(got.error or "")
    assert doc.job_id is not None
    job = meta.get_job(doc.job_id)
    assert job.error is not None and _valid(job.error)
    assert all(_valid(p.text) for p in meta.list_pages(doc.collection_id))
    document_out(got).model_dump_json()
    job_out(job).model_dump_json()


def test_sqlite_records_written_before_the_fix_read_back_repaired(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    meta = SQLiteMetadataStore(path)
    doc = _document(meta)
    meta.update_progress(doc.id, status="ready", stage="done", pages_done=3, pages_total=3)
    meta.put_pages(doc.id, [Page(document_id=doc.id, number=1, page_hash="h", text="t",
                                 text_source="text_layer", image_path="p", width=1, height=1)])
    # what the old code stored: JSON escapes of lone surrogates (json.dumps is ASCII), and
    # bytes that are not UTF-8 in TEXT columns (another tool, an encoded surrogate)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE documents SET skipped_pages = ?, error = CAST(X'6261649f' AS TEXT), "
                "filename = CAST(X'eda0802e706466' AS TEXT)",
                (json.dumps([{"number": 3, "reason": MUPDF}]),))
    raw.execute("UPDATE jobs SET error = CAST(X'ff' AS TEXT)")
    raw.execute("UPDATE pages SET text = CAST(X'74c6' AS TEXT)")
    raw.commit()
    raw.close()
    _check_repaired(meta, doc)
    assert meta.get_document(doc.id).error == "bad\\x9f"
    meta.close()


def test_redis_records_written_before_the_fix_read_back_repaired(redis_url: str,
                                                                  prefix: str) -> None:
    meta = RedisMetadataStore(redis_url, prefix=prefix)
    doc = _document(meta)
    meta.update_progress(doc.id, status="ready", stage="done", pages_done=3, pages_total=3)
    meta.put_pages(doc.id, [Page(document_id=doc.id, number=1, page_hash="h", text="t",
                                 text_source="text_layer", image_path="p", width=1, height=1)])
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.hset(f"{prefix}:doc:{doc.id}", mapping={
        "skipped_pages": json.dumps([{"number": 3, "reason": MUPDF}]),
        "error": json.dumps(MUPDF), "filename": json.dumps("a\udcc6.pdf")})
    r.hset(f"{prefix}:job:{doc.job_id}", "error", json.dumps(MUPDF))
    page = json.loads(r.hget(f"{prefix}:pages:{doc.id}", "1"))  # type: ignore[arg-type]
    r.hset(f"{prefix}:pages:{doc.id}", "1", json.dumps({**page, "text": MUPDF}))
    r.close()
    _check_repaired(meta, doc)
    assert meta.get_document(doc.id).filename == "a\\xc6.pdf"
    meta.close()
