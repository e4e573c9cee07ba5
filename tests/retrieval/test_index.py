"""The persistent retrieval index: incremental updates rank exactly as a fresh build, the
index ranks exactly as the scan path, scopes filter inside the index, and the
maintenance (hooks, consistency check, rebuild) keeps it in step with real SQLite and Redis
stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.metadata import (
    DocumentId,
    MetadataStore,
    Page,
    RedisMetadataStore,
    SQLiteMetadataStore,
)
from tests.retrieval.index_corpus import make_documents, store_document
from worker.retrieval import Embedder, embedding_from_bytes
from worker.retrieval.hybrid import Candidate, search
from worker.retrieval.index import RetrievalIndexes, search_index
from worker.retrieval.index.files import (
    FORMAT,
    current_version,
    read_manifest,
    set_current,
    write_manifest,
)
from worker.retrieval.index.maintain import index_document
from worker.retrieval.index.reader import IndexReader
from worker.retrieval.index.writer import apply, create_version

Docs = list[tuple[str, str, list[Page]]]
QUESTIONS = ["turbine vibration bearing", "dividend outlook for shareholders", "E021X",
             "oven temperature for baking dough", "patient dosage in the clinical trial",
             "router latency", "finance handbook volume 6"]
DELETED = {"doc_003_network", "doc_010_turbine", "doc_017_kitchen"}


@pytest.fixture(scope="module")
def docs(embedder: Embedder) -> Docs:
    """20 documents of 5 pages with real embeddings."""
    return make_documents(embedder, n_docs=20, pages=5)


def _build(folder: Path, steps: list[tuple[Docs, list[str]]]) -> IndexReader:
    version = folder / "v1"
    create_version(version)
    set_current(folder, version)
    for add, remove in steps:
        apply(version, add=[index_document(d, pages) for d, _, pages in add], remove=remove)
    return IndexReader(folder)


def _ranking(reader: IndexReader, q: str, embedder: Embedder,
             document_ids: list[str] | None = None) -> list[tuple[str, float]]:
    hits = search_index(reader, q, top_k=12, embedder=embedder, dense_weight=0.6,
                        document_ids=document_ids)
    assert hits is not None
    return [(h.key, round(h.score, 9)) for h in hits]


def test_incremental_adds_and_deletes_rank_as_a_fresh_build(
        tmp_path: Path, docs: Docs, embedder: Embedder) -> None:
    incremental = _build(tmp_path / "inc", [
        (docs[:7], []), (docs[7:15], ["doc_003_network"]), (docs[15:], ["doc_010_turbine"]),
        ([], ["doc_017_kitchen"]), ([docs[4]], [])])  # re-adding a live document replaces it
    live = [d for d in docs if d[0] not in DELETED]
    fresh = _build(tmp_path / "fresh", [(live, [])])
    for q in QUESTIONS:
        got = _ranking(incremental, q, embedder)
        assert got == _ranking(fresh, q, embedder), q
        assert not {k.rpartition(":")[0] for k, _ in got} & DELETED


def test_index_ranks_exactly_as_the_scan_path(tmp_path: Path, docs: Docs,
                                             embedder: Embedder) -> None:
    """BM25, dense and hybrid rankings and scores are bit-identical to the scan path's, over
    the whole collection and within a scope, after deletes too: Tantivy only chooses BM25's
    candidates, which are scored exactly as bm25s scores them (`exact_bm25.py`)."""
    reader = _build(tmp_path / "ix", [(docs, []), ([], ["doc_003_network"])])
    live = [d for d in docs if d[0] != "doc_003_network"]
    candidates = [Candidate(key=f"{p.document_id}:{p.number}", text=p.text, context=p.context,
                            embedding=embedding_from_bytes(p.embedding) if p.embedding
                            else None) for _, _, pages in live for p in pages]
    scope = ["doc_001_finance", "doc_002_kitchen", "doc_006_finance", "doc_010_turbine"]
    in_scope = [c for c in candidates if c.key.rpartition(":")[0] in scope]
    weights = [{"dense_weight": 0.0}, {"bm25_weight": 0.0}, {"dense_weight": 0.6}]
    for q in [*QUESTIONS, "turbine turbine of the bearing", "no such words zzqx"]:
        for w in weights:
            ix = search_index(reader, q, top_k=len(candidates), embedder=embedder, **w)
            scan = search(q, candidates, top_k=len(candidates), embedder=embedder, **w)
            assert ix is not None
            assert [(h.key, h.score, h.bm25_rank, h.dense_rank) for h in ix] == \
                   [(h.key, h.score, h.bm25_rank, h.dense_rank) for h in scan], (q, w)
            ix = search_index(reader, q, top_k=12, embedder=embedder, document_ids=scope, **w)
            scan = search(q, in_scope, top_k=12, embedder=embedder, **w)
            assert ix is not None
            assert [(h.key, h.score) for h in ix] == [(h.key, h.score) for h in scan], (q, w)
    code = search_index(reader, "E021X", top_k=1, embedder=embedder, dense_weight=0.6)
    assert code is not None and code[0].key == "doc_002_kitchen:2"


def test_scope_filters_inside_the_index(tmp_path: Path, docs: Docs,
                                        embedder: Embedder) -> None:
    reader = _build(tmp_path / "ix", [(docs, []), ([], ["doc_003_network"])])
    scope = ["doc_001_finance", "doc_003_network", "doc_006_finance", "doc_nope"]
    got = _ranking(reader, "dividend outlook", embedder, document_ids=scope)
    assert {k.rpartition(":")[0] for k, _ in got} == {"doc_001_finance", "doc_006_finance"}
    assert len(got) == 10  # every live page of the scope, ranked or not


@pytest.fixture(params=["sqlite", "redis"])
def meta(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str
         ) -> Iterator[MetadataStore]:
    """Both metadata stores."""
    store: MetadataStore
    if request.param == "sqlite":
        store = SQLiteMetadataStore(tmp_path / "meta.db")
    else:
        store = RedisMetadataStore(redis_url, prefix=f"t{uuid.uuid4().hex[:10]}")
    yield store
    store.close()


def test_get_pages_reads_only_the_named_ready_pages(meta: MetadataStore, docs: Docs) -> None:
    collection = meta.create_collection("c", "tenant")
    for doc_id, _, pages in docs[:3]:
        store_document(meta, collection.id, doc_id, pages)
    meta.update_progress(DocumentId(docs[2][0]), status="processing", stage="index",
                         pages_done=0, pages_total=5)
    keys = [(DocumentId(docs[1][0]), 4), (DocumentId(docs[0][0]), 2),
            (DocumentId(docs[0][0]), 99), (DocumentId(docs[2][0]), 1),
            (DocumentId("doc_missing"), 1)]
    got = meta.get_pages(keys)
    assert [(p.document_id, p.number) for p in got] == [(docs[1][0], 4), (docs[0][0], 2)]
    assert got[0].text == docs[1][2][3].text and got[0].embedding == docs[1][2][3].embedding


def test_hooks_check_and_rebuild_keep_the_index_in_step(
        meta: MetadataStore, tmp_path: Path, docs: Docs, embedder: Embedder) -> None:
    collection = meta.create_collection("c", "tenant")
    indexes = RetrievalIndexes(tmp_path / "index")
    assert indexes.check(meta, collection.id).state == "missing"
    store_document(meta, collection.id, docs[0][0], docs[0][2])
    assert indexes.document_ready(meta, collection.id, docs[0][0], docs[0][2])  # built now
    assert indexes.check(meta, collection.id).state == "ok"
    for doc_id, _, pages in docs[1:10]:
        store_document(meta, collection.id, doc_id, pages)
    assert indexes.rebuild(meta, collection.id) == 50
    assert indexes.check(meta, collection.id).state == "ok"
    for doc_id, _, pages in docs[10:]:  # ingest: ready, then the hook
        store_document(meta, collection.id, doc_id, pages)
        assert indexes.document_ready(meta, collection.id, doc_id, pages)
    for doc_id in sorted(DELETED):  # the delete path: store, then the hook
        meta.delete_document(DocumentId(doc_id))
        indexes.document_deleted(meta, collection.id, doc_id)
    assert indexes.check(meta, collection.id).state == "ok"
    reader = indexes.reader(collection.id)
    assert reader is not None
    meta.delete_document(DocumentId(docs[5][0]))  # a delete the index missed
    check = indexes.check(meta, collection.id)
    assert (check.state, check.extra) == ("stale", [docs[5][0]])
    meta_version = current_version(tmp_path / "index" / collection.id)
    indexes.rebuild(meta, collection.id)
    folder = current_version(tmp_path / "index" / collection.id)
    assert folder is not None and folder != meta_version and meta_version is not None
    assert not meta_version.exists()  # the old version is removed, not kept
    assert read_manifest(folder).live().keys() == \
        {d for d, _, _ in docs} - DELETED - {docs[5][0]}
    assert indexes.check(meta, collection.id).state == "ok"
    live = [d for d in docs if d[0] not in DELETED and d[0] != docs[5][0]]
    fresh = _build(tmp_path / "fresh", [(live, [])])
    for q in QUESTIONS:
        assert _ranking(reader, q, embedder) == _ranking(fresh, q, embedder), q


def test_an_index_of_an_older_format_is_neither_read_nor_written(
        tmp_path: Path, docs: Docs, embedder: Embedder) -> None:
    """An index written by an older release (another page-table layout) is skipped: questions
    get None (the caller scans), the delete hook leaves it alone, the check calls it stale,
    and the ingest hook rebuilds it as it builds a small collection's missing index."""
    meta = SQLiteMetadataStore(tmp_path / "meta.db")
    collection = meta.create_collection("c", "tenant")
    for doc_id, _, pages in docs[:-1]:
        store_document(meta, collection.id, doc_id, pages)
    indexes = RetrievalIndexes(tmp_path / "index")
    indexes.rebuild(meta, collection.id)
    version = current_version(tmp_path / "index" / collection.id)
    assert version is not None
    old = read_manifest(version)
    old.format = FORMAT - 1
    write_manifest(version, old)
    files = {p.name: p.read_bytes() for p in version.iterdir() if p.is_file()}
    reader = indexes.reader(collection.id)
    assert reader is not None and reader.snapshot() is None
    assert search_index(reader, QUESTIONS[0], top_k=3, embedder=embedder) is None
    meta.delete_document(DocumentId(docs[0][0]))
    indexes.document_deleted(meta, collection.id, docs[0][0])
    assert {p.name: p.read_bytes() for p in version.iterdir() if p.is_file()} == files
    assert indexes.check(meta, collection.id).state == "stale"
    doc_id, _, pages = docs[-1]
    store_document(meta, collection.id, doc_id, pages)
    assert indexes.document_ready(meta, collection.id, doc_id, pages)  # rebuilt from the store
    assert indexes.check(meta, collection.id).state == "ok"
    hits = search_index(reader, QUESTIONS[0], top_k=3, embedder=embedder)
    assert hits is not None and len(hits) == 3
    meta.close()


def test_a_deleted_collection_leaves_no_index_behind(tmp_path: Path, docs: Docs) -> None:
    meta = SQLiteMetadataStore(tmp_path / "meta.db")
    collection = meta.create_collection("c", "tenant")
    store_document(meta, collection.id, docs[0][0], docs[0][2])
    indexes = RetrievalIndexes(tmp_path / "index")
    indexes.rebuild(meta, collection.id)
    assert indexes.indexed_collections() == [collection.id]
    indexes.remove_collection(collection.id)
    assert indexes.indexed_collections() == []
    assert indexes.check(meta, collection.id).state == "missing"
    meta.close()


def test_the_index_tokenises_exactly_as_bm25s() -> None:
    import bm25s

    from worker.retrieval.bm25 import _stemmer, tokenize

    texts = ["The Turbines' rotor-blades were INSPECTED (twice) in 2023, per ISO_9001.",
             "Über naïve cafés: déjà vu! a I x y2 E052X e052x", "", "   ", "and the of",
             "running runs ran runner's generously généreusement 北京 北京市 ab"]
    expected = bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(), return_ids=False,
                              show_progress=False)
    assert tokenize(texts) == expected
    assert tokenize(texts[:1])[0] == expected[0] and tokenize([texts[1]])[0] == expected[1]
