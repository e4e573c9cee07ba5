"""Deleting a document removes the pages only it used, from every tier (both metadata stores)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from storage.gc import release_pages
from storage.keys import PageHash
from storage.kv.disk import DiskKVStore
from storage.kv.memory import MemoryKVStore
from storage.kv.redis_store import RedisKVStore
from storage.kv.tiered import TieredKVStore
from storage.metadata import (
    CollectionId,
    Document,
    DocumentId,
    MetadataStore,
    Page,
    SQLiteMetadataStore,
    new_id,
)
from tests.storage.kv_testkit import make_page


def _k(i: int) -> PageHash:
    return PageHash(f"{i:02x}" + "01" * 31)


def _add_doc(meta: MetadataStore, col: CollectionId, hashes: Sequence[PageHash]) -> DocumentId:
    doc = Document(id=DocumentId(new_id("doc")), collection_id=col, filename="x.pdf",
                   sha256="0" * 64, size_bytes=1)
    meta.add_document(doc)
    meta.put_pages(doc.id, [Page(document_id=doc.id, number=n, page_hash=h, text="",
                                 text_source="none", image_path="", width=1, height=1)
                            for n, h in enumerate(hashes, start=1)])
    return doc.id


def test_release_pages_removes_only_orphans_from_every_tier(
        meta: MetadataStore, tmp_path: Path, redis_url: str, prefix: str) -> None:
    kv = TieredKVStore([("memory", MemoryKVStore(1 << 28)),
                        ("redis", RedisKVStore(redis_url, prefix=prefix)),
                        ("disk", DiskKVStore(tmp_path / "kv", 1 << 30))])
    kv.put_many({_k(i): make_page(i) for i in (1, 2, 3)})
    col = meta.create_collection("c", "t").id
    doc_a = _add_doc(meta, col, [_k(1), _k(2)])
    doc_b = _add_doc(meta, col, [_k(2), _k(3)])

    assert release_pages(kv, meta, doc_a) == [_k(1)]
    for name, tier in kv.tiers:
        assert tier.contains([_k(1), _k(2), _k(3)]) == {_k(2), _k(3)}, name
    assert release_pages(kv, meta, doc_b) == sorted([_k(2), _k(3)])
    for name, tier in kv.tiers:
        assert tier.contains([_k(1), _k(2), _k(3)]) == set(), name


class _RacingStore(SQLiteMetadataStore):
    """A real SQLite store in which another ingest references an orphan right after the
    delete (what a concurrent worker can do between `delete_document` and the KV delete)."""

    def __init__(self, path: Path, late: PageHash) -> None:
        super().__init__(path)
        self.late = late

    def delete_document(self, document_id: DocumentId) -> list[str]:
        orphans = super().delete_document(document_id)
        col = self.create_collection(new_id("late"), "t").id
        _add_doc(self, col, [self.late])
        return orphans


def test_release_pages_keeps_a_page_reused_meanwhile(tmp_path: Path) -> None:
    meta = _RacingStore(tmp_path / "m.db", late=_k(2))
    kv = MemoryKVStore(1 << 28)
    kv.put_many({_k(1): make_page(1), _k(2): make_page(2)})
    doc = _add_doc(meta, meta.create_collection("c", "t").id, [_k(1), _k(2)])
    assert release_pages(kv, meta, doc) == [_k(1)]
    assert kv.contains([_k(1), _k(2)]) == {_k(2)}
