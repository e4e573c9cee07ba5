"""Tenant usage and quotas in both metadata stores (issue 60 point 2): usage is counted from
the records (shared collections included, other tenants not), a quota refuses the document
that would pass it naming the limit, concurrent inserts never overshoot, and a delete gives
the room back. A full disk: the SQLite store's deletes and status writes still commit (its
reserve file is released), an insert raises `DiskFullError` and keeps nothing."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.errors import DiskFullError, QuotaExceededError
from storage.metadata import (
    CollectionId,
    Document,
    DocumentId,
    MetadataStore,
    Page,
    SQLiteMetadataStore,
    new_id,
)
from storage.metadata.usage import Quota, Usage
from storage.space import free_bytes
from tests.small_disk import fill, small_tmpfs


def _doc(col: CollectionId, size: int = 100, pages: int = 2) -> Document:
    return Document(id=DocumentId(new_id("doc")), collection_id=col, filename="a.pdf",
                    sha256="0" * 64, size_bytes=size, pages_total=pages)


def test_usage_counts_a_tenants_documents(meta: MetadataStore) -> None:
    mine = meta.create_collection("a", "t1")
    shared = meta.create_collection("s", "t1", shared=True)
    theirs = meta.create_collection("a", "t2")
    assert meta.usage("t1") == Usage()
    doomed = _doc(mine.id, 100, 2)
    for doc in (doomed, _doc(shared.id, 50, 3), _doc(theirs.id, 7, 1)):
        meta.add_document(doc)
    assert meta.usage("t1") == Usage(bytes=150, documents=2, pages=5)
    assert meta.usage("t2") == Usage(bytes=7, documents=1, pages=1)
    meta.delete_document(doomed.id)
    assert meta.usage("t1") == Usage(bytes=50, documents=1, pages=3)
    assert meta.usage("nobody") == Usage()


@pytest.mark.parametrize(("quota", "name"), [(Quota(bytes=250), "bytes"),
                                             (Quota(documents=2), "documents"),
                                             (Quota(pages=5), "pages")])
def test_a_quota_refuses_the_document_that_passes_it(meta: MetadataStore, quota: Quota,
                                                     name: str) -> None:
    col = meta.create_collection("a", "t1")
    other = meta.create_collection("a", "t2")
    meta.add_document(_doc(col.id, 100, 2), quota)
    meta.add_document(_doc(col.id, 100, 2), quota)
    refused = _doc(col.id, 100, 2)
    with pytest.raises(QuotaExceededError) as info:
        meta.add_document(refused, quota)
    assert (info.value.quota, info.value.limit) == (name, getattr(quota, name))
    assert f"quota of {getattr(quota, name)} {name}" in str(info.value)
    assert meta.usage("t1") == Usage(200, 2, 4)
    assert [d.id for d in meta.list_documents(col.id)] != [] and refused.id not in {
        d.id for d in meta.list_documents(col.id)}
    meta.add_document(_doc(other.id, 100, 2), quota)  # another tenant is not affected
    meta.add_document(_doc(other.id, 100, 2), quota)
    first = meta.list_documents(col.id)[0]
    meta.delete_document(first.id)  # a delete gives the room back
    meta.add_document(refused, quota)


def test_concurrent_inserts_never_pass_a_quota(meta: MetadataStore) -> None:
    col = meta.create_collection("a", "t1")
    quota = Quota(documents=5)
    barrier = threading.Barrier(16)
    outcomes: list[str] = []

    def insert() -> None:
        barrier.wait()
        try:
            meta.add_document(_doc(col.id), quota)
            outcomes.append("added")
        except QuotaExceededError:
            outcomes.append("refused")

    threads = [threading.Thread(target=insert) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["added"] * 5 + ["refused"] * 11
    assert meta.usage("t1").documents == len(meta.list_documents(col.id)) == 5


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs."""
    with small_tmpfs(tmp_path / "fs", 48) as folder:
        yield folder


def test_sqlite_deletes_and_status_writes_commit_on_a_full_disk(small_fs: Path) -> None:
    meta = SQLiteMetadataStore(small_fs / "meta.db")
    reserve = small_fs / "meta.db.reserve"
    assert reserve.stat().st_blocks * 512 >= 16 * 2**20  # allocated, not sparse
    col = meta.create_collection("c", "t")
    docs = [_doc(col.id) for _ in range(40)]
    for doc in docs:  # enough rows that a delete rewrites many database pages
        meta.add_document(doc)
        meta.put_pages(doc.id, [Page(document_id=doc.id, number=n, page_hash="ab" * 32,
                                     text="word " * 400, text_source="text_layer",
                                     image_path="x", width=1, height=1, embedding=bytes(1536))
                                for n in range(1, 21)])
    fill(small_fs)
    assert free_bytes(small_fs) < 4096
    with pytest.raises(DiskFullError):  # the log's free frames first take a few small writes
        for i in range(10_000):
            meta.create_collection(f"d{i}", "t")
    added = 0
    with pytest.raises(DiskFullError):  # a rolled-back write can leave a frame or two free
        for _ in range(1000):
            meta.add_document(_doc(col.id))
            added += 1
    assert len(meta.list_documents(col.id)) == 40 + added
    meta.update_progress(docs[0].id, status="failed", stage="done", pages_done=0,
                         pages_total=20, error="out of disk space")
    meta.delete_document(docs[1].id)
    meta.delete_document(docs[2].id)
    assert not reserve.exists()
    assert meta.get_document(docs[0].id).status == "failed"
    assert len(meta.list_documents(col.id)) == 38 + added
    (small_fs / "ballast").unlink()
    meta.delete_document(docs[3].id)  # the next delete with room takes the reserve again
    assert reserve.exists()
    meta.close()
    reopened = SQLiteMetadataStore(small_fs / "meta.db")
    assert len(reopened.list_documents(col.id)) == 37 + added
    reopened.close()
    assert os.path.getsize(reserve) == 16 * 2**20
