"""A full disk (issue 13): the service's home on a small tmpfs, filled by a ballast file.

Upload with no space left: 507 with a message, nothing kept. Ingest that runs out of space
half-way (page images, KV): the document ends `failed` with a message naming the disk, is
deletable, and leaves no files. With the space back, the same upload ends `ready` and is
answered. The process stays up throughout. Needs root to mount a tmpfs (CI runs as root);
skipped with the reason otherwise. A KV write to a full disk is counted, leaves no partial
file, and the page stays served from memory.

Issue 60: on a full disk every route answers JSON (507 at worst, never 500): creating a
collection, uploading; reads still answer; `DELETE` of a document succeeds and frees its
space (files first, then the records, with the database's reserve file released if need be),
after which uploads work again. Below the free-space reserve (`CONDUIT_DISK_RESERVE_BYTES`)
uploads get 507 naming it while metadata writes (a new collection) still work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage.keys import PageHash
from storage.kv import DiskKVStore, MemoryKVStore, TieredKVStore
from storage.space import free_bytes
from tests.faults.conftest import Server, assert_no_orphan_files, settled
from tests.pdfs import text_pdf
from tests.small_disk import fill, small_tmpfs
from tests.storage.kv_testkit import assert_same_page, make_page

PAGES = [f"Section {i}: the inspection interval of valve {i} is {7 * i} days. " * 12
         for i in range(1, 9)]


@pytest.fixture
def small_home(tmp_path: Path) -> Iterator[Path]:
    """The service's home on a 160 MiB tmpfs."""
    with small_tmpfs(tmp_path / "home", 160) as home:
        yield home


def _documents(server: Server, col: str) -> list[dict[str, object]]:
    docs: list[dict[str, object]] = server.client().get(
        f"/v1/collections/{col}/documents").json()
    return docs


def test_disk_full_during_upload_and_ingest(small_home: Path,
                                            server_factory: Callable[..., Server]) -> None:
    server = server_factory("home", CONDUIT_DISK_RESERVE_BYTES="0")
    server.start()
    client = server.client()
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    pdf = text_pdf(PAGES)
    # a first document writes the model files, the database and one document's pages and KV
    first = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("a.pdf", pdf, "application/pdf")}).json()
    assert settled(client, first["document_id"])["status"] == "ready"
    per_doc = sum(p.stat().st_size for d in ("pages", "kv", "uploads")
                  for p in (small_home / d).rglob("*") if p.is_file())

    # upload with (almost) no space left: 507, nothing kept
    ballast = fill(small_home, leave=8 * 1024)
    r = client.post(f"/v1/collections/{col}/documents",
                    files={"file": ("b.pdf", pdf, "application/pdf")})
    assert r.status_code == 507, r.text
    assert "disk space" in r.json()["detail"]
    assert [d["document_id"] for d in _documents(server, col)] == [first["document_id"]]
    assert_no_orphan_files(small_home, {first["document_id"]})

    # room for the upload, not for its pages and KV: failed with a message, deletable
    ballast.unlink()
    ballast = fill(small_home, leave=len(pdf) + 256 * 1024)
    assert free_bytes(small_home) < per_doc
    r = client.post(f"/v1/collections/{col}/documents",
                    files={"file": ("c.pdf", pdf, "application/pdf")})
    if r.status_code == 507:  # the database's own growth can take the last bytes
        assert "disk space" in r.json()["detail"]
    else:
        assert r.status_code == 202, r.text
        doc = settled(client, r.json()["document_id"], timeout=600)
        assert doc["status"] == "failed", doc
        assert "space" in str(doc["error"]).lower(), doc
        assert client.delete(f"/v1/documents/{doc['document_id']}").status_code == 204
    assert_no_orphan_files(small_home, {first["document_id"]})
    assert client.get("/healthz").status_code == 200

    # space back: the same file ingests and is answered
    ballast.unlink()
    again = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("c.pdf", pdf, "application/pdf")}).json()
    assert settled(client, again["document_id"], timeout=600)["status"] == "ready"
    answer = client.post("/v1/query", json={"collection_id": col, "top_k": 2,
                                            "question": "How often is valve 3 inspected?",
                                            "max_new_tokens": 4})
    assert answer.status_code == 200, answer.text
    assert server.proc is not None and server.proc.poll() is None


RESERVE = 64 * 2**10


def _files_bytes(home: Path) -> int:
    return sum(p.stat().st_size for d in ("pages", "kv", "uploads")
               for p in (home / d).rglob("*") if p.is_file())


def test_full_disk_answers_507_and_a_delete_frees_space(
        small_home: Path, server_factory: Callable[..., Server]) -> None:
    server = server_factory("home", CONDUIT_DISK_RESERVE_BYTES=str(RESERVE))
    server.start()
    client = server.client()
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    first = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("a.pdf", text_pdf(PAGES), "application/pdf")}).json()
    assert settled(client, first["document_id"])["status"] == "ready"
    per_doc = _files_bytes(small_home)
    assert per_doc > 2 * RESERVE, per_doc

    # a full disk: a write answers 507 with a JSON message, never 500 (SQLite's log has a
    # few free frames first: new collections fit until it fills)
    ballast = fill(small_home, leave=0)
    for i in range(500):
        r = client.post("/v1/collections", json={"name": f"full-{i}"})
        if r.status_code != 201:
            break
    assert r.status_code == 507, r.text
    assert "disk is full" in r.json()["detail"]
    r = client.post(f"/v1/collections/{col}/documents",
                    files={"file": ("b.pdf", text_pdf(PAGES[:1]), "application/pdf")})
    assert r.status_code == 507 and "disk space" in r.json()["detail"], r.text
    for path in ("/healthz", "/v1/usage", f"/v1/collections/{col}/documents"):
        assert client.get(path).status_code == 200, path

    # DELETE works on the full disk and frees the document's space first
    before = free_bytes(small_home)
    r = client.delete(f"/v1/documents/{first['document_id']}")
    assert r.status_code == 204, r.text
    assert free_bytes(small_home) - before >= 0.8 * per_doc
    assert _files_bytes(small_home) == 0
    assert client.get(f"/v1/documents/{first['document_id']}").status_code == 404

    # and uploads work again in the space it freed
    again = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("c.pdf", text_pdf(PAGES[:1]), "application/pdf")})
    assert again.status_code == 202, again.text
    assert settled(client, again.json()["document_id"], timeout=600)["status"] == "ready"

    # below the reserve (not full): uploads get 507 naming it, metadata writes still work
    ballast.unlink()
    ballast = fill(small_home, leave=RESERVE // 2)
    r = client.post(f"/v1/collections/{col}/documents",
                    files={"file": ("d.pdf", text_pdf(PAGES[:1]), "application/pdf")})
    assert r.status_code == 507, r.text
    assert "CONDUIT_DISK_RESERVE_BYTES" in r.json()["detail"]
    assert client.post("/v1/collections", json={"name": "below"}).status_code == 201
    assert server.proc is not None and server.proc.poll() is None


def test_kv_write_to_a_full_disk_is_counted_and_served_from_memory(small_home: Path) -> None:
    key = PageHash("cd" * 32)
    page = make_page(3)
    disk = DiskKVStore(small_home / "kv", 1 << 30)
    stack = TieredKVStore([("memory", MemoryKVStore(1 << 30)), ("disk", disk)])
    fill(small_home, leave=4 * 1024)
    stack.put_many({key: page})  # the disk tier's write fails; nothing raises
    assert disk.stats().errors == 1
    assert [p.name for p in (small_home / "kv").rglob("*") if p.is_file()] == []
    assert_same_page(stack.get_many([key])[key], page)
