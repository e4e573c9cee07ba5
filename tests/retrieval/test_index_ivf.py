"""The vectors' inverted file of large collections (`ivf.py`): k-means finds real clusters,
lists follow every add and retrain, probing every list is the exact ranking, a partial probe
scores exactly what it reads, small scopes stay exact, rebuilds train once, and a retrain in
the background catches up with rows added meanwhile."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest

from storage.metadata import SQLiteMetadataStore
from tests.retrieval.index_corpus import make_documents, store_document
from tests.retrieval.test_index import QUESTIONS, Docs
from worker.retrieval import Embedder
from worker.retrieval.index import RetrievalIndexes, ivf, search_index
from worker.retrieval.index.files import current_version, ivf_paths, read_manifest, set_current
from worker.retrieval.index.maintain import index_document
from worker.retrieval.index.reader import IndexReader, dense_top
from worker.retrieval.index.writer import apply, create_version, retrain


@pytest.fixture(scope="module")
def docs(embedder: Embedder) -> Docs:
    """30 documents of 4 pages with real embeddings."""
    return make_documents(embedder, n_docs=30, pages=4, seed=3)


def _index(folder: Path, docs: Docs, *, ivf_min_rows: int) -> IndexReader:
    version = folder / "v1"
    create_version(version)
    set_current(folder, version)
    apply(version, add=[index_document(d, pages) for d, _, pages in docs],
          ivf_min_rows=ivf_min_rows)
    return IndexReader(folder)


def _dense(reader: IndexReader, q: str, embedder: Embedder, scan_rows: int,
           document_ids: list[str] | None = None) -> list[tuple[str, float]]:
    hits = search_index(reader, q, top_k=15, bm25_weight=0.0, embedder=embedder,
                        scan_rows=scan_rows, document_ids=document_ids)
    assert hits is not None
    return [(h.key, round(h.score, 9)) for h in hits]


def test_kmeans_finds_separated_clusters_and_probe_takes_the_nearest_lists() -> None:
    rng = np.random.default_rng(0)
    centres = np.eye(8, 16, dtype=np.float32)  # 8 orthogonal directions
    points = np.repeat(centres, 200, axis=0) + rng.normal(0, 0.05, (1600, 16)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    centroids = ivf.train(points, 8)
    nearest = ivf.assign(points, centroids)
    for c in range(8):  # each true cluster lands in one list, whole
        assert len(set(nearest[c * 200:(c + 1) * 200].tolist())) == 1
    assert len(set(nearest.tolist())) == 8
    probed = ivf.probe(centroids, centres[3], rows=1600, scan_rows=400)  # 2 lists of 200
    assert len(probed) == 2 and nearest[3 * 200] in probed
    assert ivf.list_count(100) == 40 and ivf.list_count(10**9) == 4096
    assert not ivf.due(100, 0, min_rows=200) and ivf.due(200, 0, min_rows=200)
    assert not ivf.due(700, 200, min_rows=200) and ivf.due(800, 200, min_rows=200)


def test_probing_every_list_is_the_exact_ranking_and_a_partial_probe_scores_exactly(
        tmp_path: Path, docs: Docs, embedder: Embedder) -> None:
    exact = _index(tmp_path / "exact", docs, ivf_min_rows=ivf.MIN_ROWS)
    approx = _index(tmp_path / "ivf", docs, ivf_min_rows=1)
    snap, exact_snap = approx.snapshot(), exact.snapshot()
    assert snap is not None and snap.centroids is not None and exact_snap is not None
    rows = snap.manifest.rows
    assert snap.manifest.ivf_lists == ivf.list_count(rows) and snap.manifest.ivf_rows == rows
    for q in QUESTIONS:
        assert _dense(approx, q, embedder, scan_rows=rows) == \
            _dense(exact, q, embedder, ivf.SCAN_ROWS), q
        vector = embedder.embed_query(q)
        truth = dense_top(exact_snap, vector, exact_snap.alive, 200)
        part = dense_top(snap, vector, snap.alive, 200, scan_rows=rows // 5)
        assert 0 < len(part.ordinals) < rows  # only the probed lists' pages
        # every page here has one passage: a scored page's score is its exact score (to the
        # float32 rounding of a dot product over fewer rows)
        exact_score = dict(zip(truth.ordinals.tolist(), truth.scores.tolist(), strict=True))
        assert np.allclose([exact_score[o] for o in part.ordinals.tolist()], part.scores,
                           rtol=0, atol=1e-6)
        assert part.ordinals[0] == truth.ordinals[0], q  # the nearest lists hold the best


def test_pages_named_by_the_other_ranking_are_scored_exactly(
        tmp_path: Path, docs: Docs, embedder: Embedder) -> None:
    exact = _index(tmp_path / "exact", docs, ivf_min_rows=ivf.MIN_ROWS)
    approx = _index(tmp_path / "ivf", docs, ivf_min_rows=1)
    snap, exact_snap = approx.snapshot(), exact.snapshot()
    assert snap is not None and exact_snap is not None
    vector = embedder.embed_query("router latency")
    truth = dense_top(exact_snap, vector, exact_snap.alive, 200)
    exact_score = dict(zip(truth.ordinals.tolist(), truth.scores.tolist(), strict=True))
    alone = dense_top(snap, vector, snap.alive, 200, scan_rows=1)  # the nearest list only
    far = np.setdiff1d(truth.ordinals[-10:], alone.ordinals)  # the 10 least similar pages
    assert len(far)
    got = dense_top(snap, vector, snap.alive, 200, scan_rows=1, also=far)
    scored = dict(zip(got.ordinals.tolist(), got.scores.tolist(), strict=True))
    assert set(got.ordinals.tolist()) == set(alone.ordinals.tolist()) | set(far.tolist())
    assert np.allclose([scored[o] for o in far.tolist()], [exact_score[o] for o in far.tolist()],
                       rtol=0, atol=1e-6)


def test_small_scopes_are_scored_exactly(tmp_path: Path, docs: Docs,
                                         embedder: Embedder) -> None:
    exact = _index(tmp_path / "exact", docs, ivf_min_rows=ivf.MIN_ROWS)
    approx = _index(tmp_path / "ivf", docs, ivf_min_rows=1)
    scope = [docs[1][0], docs[6][0], docs[11][0]]
    for q in QUESTIONS:
        assert _dense(approx, q, embedder, 12, scope) == _dense(exact, q, embedder, 12, scope)


def test_lists_follow_adds_and_retraining_switches_files(tmp_path: Path, docs: Docs) -> None:
    version = tmp_path / "v1"
    create_version(version)
    add = [index_document(d, pages) for d, _, pages in docs]
    manifest = apply(version, add=add[:4], ivf_min_rows=20)
    assert manifest.ivf == "" and manifest.rows == 16  # below 20 rows: exact, no lists
    manifest = apply(version, add=add[4:6], ivf_min_rows=20)
    first = manifest.ivf
    assert first and manifest.ivf_rows == 24
    manifest = apply(version, add=add[6:20], ivf_min_rows=20)  # 80 rows < 4 x 24: appended
    assert manifest.ivf == first and manifest.ivf_rows == 24
    centroids_path, lists_path = ivf_paths(version, first)
    lists = np.fromfile(lists_path, dtype=np.int32)
    assert len(lists) == 80 and lists.max() < manifest.ivf_lists
    vectors = np.fromfile(version / "vectors.f32", dtype=np.float32).reshape(80, -1)
    centroids = np.fromfile(centroids_path, dtype=np.float32).reshape(manifest.ivf_lists, -1)
    assert np.array_equal(lists, ivf.assign(vectors, centroids))
    manifest = apply(version, add=add[20:], remove=[docs[0][0]], ivf_min_rows=20)  # 120 rows
    assert manifest.ivf != first and manifest.ivf_rows == 120  # >= 4 x 24: retrained
    assert not centroids_path.exists() and not lists_path.exists()  # the old lists are gone
    assert len(np.fromfile(ivf_paths(version, manifest.ivf)[1], dtype=np.int32)) == 120
    assert read_manifest(version) == manifest


def test_a_rebuild_trains_once_and_hooks_append(tmp_path: Path, docs: Docs,
                                               embedder: Embedder) -> None:
    meta = SQLiteMetadataStore(tmp_path / "meta.db")
    collection = meta.create_collection("c", "tenant")
    for doc_id, _, pages in docs[:25]:
        store_document(meta, collection.id, doc_id, pages)
    indexes = RetrievalIndexes(tmp_path / "index", ivf_min_rows=50)
    assert indexes.rebuild(meta, collection.id) == 100
    version = current_version(tmp_path / "index" / collection.id)
    assert version is not None
    built = read_manifest(version)
    assert built.ivf and built.ivf_rows == 100  # trained on the whole build, not at 50 rows
    for doc_id, _, pages in docs[25:]:
        store_document(meta, collection.id, doc_id, pages)
        assert indexes.document_ready(meta, collection.id, doc_id, pages)
    after = read_manifest(version)
    assert after.ivf == built.ivf and after.rows == 120
    reader = indexes.reader(collection.id)
    assert reader is not None
    hits = _dense(reader, "patient dosage in the clinical trial", embedder, scan_rows=120)
    exact = _index(tmp_path / "exact", docs, ivf_min_rows=ivf.MIN_ROWS)
    assert hits == _dense(exact, "patient dosage in the clinical trial", embedder, 120)
    meta.close()


def test_retraining_catches_up_with_rows_added_meanwhile_and_yields_to_a_faster_writer(
        tmp_path: Path, docs: Docs) -> None:
    version = tmp_path / "v1"
    create_version(version)
    add = [index_document(d, pages) for d, _, pages in docs]
    first = apply(version, add=add[:6], ivf_min_rows=20)  # trained at 24 rows
    apply(version, add=add[6:25], train=False)  # 100 rows: due, left to `retrain`
    assert ivf.due(100, first.ivf_rows, 20)

    def lock_after_a_concurrent_add() -> contextlib.AbstractContextManager[object]:
        apply(version, add=add[25:], train=False)  # another writer commits while we train
        return contextlib.nullcontext()

    assert retrain(version, lock_after_a_concurrent_add)
    manifest = read_manifest(version)
    assert manifest.rows == 120 and manifest.ivf_rows == 100 and manifest.ivf != first.ivf
    centroids_path, lists_path = ivf_paths(version, manifest.ivf)
    vectors = np.fromfile(version / "vectors.f32", dtype=np.float32).reshape(120, -1)
    centroids = np.fromfile(centroids_path, dtype=np.float32).reshape(manifest.ivf_lists, -1)
    assert np.array_equal(np.fromfile(lists_path, dtype=np.int32),
                          ivf.assign(vectors, centroids))  # the 20 late rows included
    assert sorted(p.name for p in version.glob("ivf-*")) == \
        sorted(p.name for p in ivf_paths(version, manifest.ivf))  # the old lists are gone

    def lock_after_another_retrain() -> contextlib.AbstractContextManager[object]:
        assert retrain(version, contextlib.nullcontext)
        return contextlib.nullcontext()

    assert not retrain(version, lock_after_another_retrain)  # the other one switched first
    winner = read_manifest(version)
    assert winner.ivf != manifest.ivf
    assert sorted(p.name for p in version.glob("ivf-*")) == \
        sorted(p.name for p in ivf_paths(version, winner.ivf))  # ours left nothing behind


def test_the_ingest_hook_retrains_in_the_background(tmp_path: Path, docs: Docs) -> None:
    meta = SQLiteMetadataStore(tmp_path / "meta.db")
    collection = meta.create_collection("c", "tenant")
    indexes = RetrievalIndexes(tmp_path / "index", ivf_min_rows=20)
    for doc_id, _, pages in docs[:6]:
        store_document(meta, collection.id, doc_id, pages)
    indexes.rebuild(meta, collection.id)
    version = current_version(tmp_path / "index" / collection.id)
    assert version is not None and read_manifest(version).ivf_rows == 24
    for doc_id, _, pages in docs[6:25]:
        store_document(meta, collection.id, doc_id, pages)
        indexes.document_ready(meta, collection.id, doc_id, pages)
    deadline = time.monotonic() + 60
    while read_manifest(version).ivf_rows < 96 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_manifest(version).ivf_rows >= 96  # retrained once past 4 x 24 rows
    meta.close()
