"""Concurrent rebuilds of one collection's index (issue 60 point 6): threads of one process
and separate processes on one home each rebuild the same collection at once. Every rebuild
ends without an error, CURRENT names a version folder that holds its manifest, the index is
in step with the store, and only that one version folder is left (a rebuild never removes the
folder another rebuild is filling or has just switched to)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from storage.metadata import SQLiteMetadataStore
from tests.retrieval.index_corpus import make_documents, store_document
from worker.retrieval import Embedder
from worker.retrieval.index import RetrievalIndexes
from worker.retrieval.index.files import current_version, read_manifest

REBUILDERS = 4
ROUNDS = 3


@pytest.fixture
def home(tmp_path: Path, embedder: Embedder) -> tuple[Path, str]:
    """A SQLite store with one collection of 16 ready documents; its index root."""
    meta = SQLiteMetadataStore(tmp_path / "meta.db")
    collection = meta.create_collection("c", "tenant")
    for doc_id, _, pages in make_documents(embedder, n_docs=16, pages=3):
        store_document(meta, collection.id, doc_id, pages)
    meta.close()
    return tmp_path, collection.id


def _rebuild(folder: str, collection_id: str) -> int:
    """One rebuild with its own store handle and its own `RetrievalIndexes` (as another
    process, or another entry point of the same process, would have)."""
    meta = SQLiteMetadataStore(Path(folder) / "meta.db")
    try:
        return RetrievalIndexes(Path(folder) / "index").rebuild(meta, collection_id)
    finally:
        meta.close()


def _assert_one_live_version(folder: Path, collection_id: str) -> None:
    cdir = folder / "index" / collection_id
    version = current_version(cdir)
    assert version is not None, f"CURRENT names a missing folder: {sorted(cdir.iterdir())}"
    assert read_manifest(version).pages == 16 * 3
    assert sorted(p.name for p in cdir.glob("v*")) == [version.name]
    meta = SQLiteMetadataStore(folder / "meta.db")
    try:
        assert RetrievalIndexes(folder / "index").check(meta, collection_id).state == "ok"
    finally:
        meta.close()


def _rebuild_at_once(folder: Path, collection_id: str) -> tuple[list[int], list[BaseException]]:
    """`REBUILDERS` threads start a rebuild together; their page counts and errors."""
    errors: list[BaseException] = []
    pages: list[int] = []
    barrier = threading.Barrier(REBUILDERS)

    def run() -> None:
        barrier.wait()
        try:
            pages.append(_rebuild(str(folder), collection_id))
        except BaseException as exc:  # noqa: BLE001 - collected, asserted by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(REBUILDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return pages, errors


def test_concurrent_rebuilds_in_threads_are_serialised(home: tuple[Path, str]) -> None:
    folder, collection_id = home
    for _ in range(ROUNDS):
        pages, errors = _rebuild_at_once(folder, collection_id)
        assert errors == []
        assert pages == [16 * 3] * REBUILDERS
        _assert_one_live_version(folder, collection_id)


def test_concurrent_rebuilds_in_processes_are_serialised(home: tuple[Path, str]) -> None:
    folder, collection_id = home
    spawn = multiprocessing.get_context("spawn")  # no fork of a process with threads
    with spawn.Pool(REBUILDERS) as pool:
        for _ in range(ROUNDS):
            got = pool.starmap(_rebuild, [(str(folder), collection_id)] * REBUILDERS)
            assert got == [16 * 3] * REBUILDERS
            _assert_one_live_version(folder, collection_id)
