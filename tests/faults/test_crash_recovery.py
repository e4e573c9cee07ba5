"""Finding 2: no document stuck after the serving process dies (embedded form).

Before the fix, after `kill -9` during an ingest and a restart the document stayed
`processing` forever, its job `running`, DELETE answered 409 and its collection could not be
deleted; after SIGTERM, queued documents stayed `queued`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import httpx

from tests.faults.conftest import Server, assert_no_orphan_files, job_status, settled, wait_for
from tests.pdfs import text_pdf

PAGES = [f"Section {i}: the inspection interval of valve {i} is {7 * i} days." for i in
         range(1, 7)]


def _upload(server: Server, col: str, name: str = "a.pdf") -> dict[str, str]:
    r = server.client().post(f"/v1/collections/{col}/documents",
                             files={"file": (name, text_pdf(PAGES), "application/pdf")})
    assert r.status_code == 202, r.text
    out: dict[str, str] = r.json()
    return out


def _job_running(server: Server, job_id: str) -> bool:
    try:
        return bool(server.client().get(f"/v1/jobs/{job_id}").json()["status"] == "running")
    except httpx.TransportError:
        return False


def test_sigkill_mid_ingest_then_restart_finishes_the_document(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    col = server.client().post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    up = _upload(server, col)
    wait_for(lambda: _job_running(server, up["job_id"]), 600, "the ingest to start")
    server.kill(signal.SIGKILL)  # mid-ingest: the job is claimed, its lease stops beating

    server.start()
    client = server.client()
    doc = settled(client, up["document_id"])
    assert doc["status"] == "ready", doc
    assert job_status(client, up["job_id"]) == "succeeded"
    assert client.post("/v1/query", json={"collection_id": col, "question": "valve 3?",
                                          "top_k": 1, "max_new_tokens": 2}).status_code == 200
    assert client.delete(f"/v1/documents/{up['document_id']}").status_code == 204
    assert client.delete(f"/v1/collections/{col}").status_code == 204
    assert_no_orphan_files(server.home, set())


def test_a_document_that_keeps_killing_its_worker_fails_and_is_deletable(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory(CONDUIT_MAX_INGEST_ATTEMPTS="1")
    server.start()
    col = server.client().post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    up = _upload(server, col)
    wait_for(lambda: _job_running(server, up["job_id"]), 600, "the ingest to start")
    server.kill(signal.SIGKILL)  # the one allowed attempt dies

    server.start()
    client = server.client()
    doc = settled(client, up["document_id"])
    assert doc["status"] == "failed" and "not retried" in doc["error"], doc
    assert client.get(f"/v1/jobs/{up['job_id']}").json()["status"] == "failed"
    assert not (server.home / "pages" / up["document_id"]).exists()  # no page images kept
    assert client.delete(f"/v1/documents/{up['document_id']}").status_code == 204
    assert client.delete(f"/v1/collections/{col}").status_code == 204
    assert_no_orphan_files(server.home, set())


def test_sigterm_with_queued_documents_requeues_them_at_the_next_start(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory()
    server.start()
    col = server.client().post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    uploads = [_upload(server, col, f"d{i}.pdf") for i in range(3)]
    server.kill(signal.SIGTERM)  # graceful: the running job finishes, queued ones are dropped
    server.start()
    client = server.client()
    for up in uploads:
        assert settled(client, up["document_id"])["status"] == "ready"
        assert job_status(client, up["job_id"]) == "succeeded"


def test_delete_is_refused_only_while_a_live_worker_ingests(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory(CONDUIT_JOB_LEASE_S="120")
    server.start()
    client = server.client()
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    first, second = _upload(server, col, "a.pdf"), _upload(server, col, "b.pdf")
    wait_for(lambda: _job_running(server, first["job_id"]), 600, "the first ingest to start")
    # the first is held by the live job thread; the second still waits in the queue
    busy = client.delete(f"/v1/documents/{first['document_id']}")
    queued = client.delete(f"/v1/documents/{second['document_id']}")
    if client.get(f"/v1/jobs/{first['job_id']}").json()["status"] == "running":
        assert busy.status_code == 409 and "being ingested" in busy.json()["detail"]
    assert queued.status_code == 204, queued.text
    assert client.get(f"/v1/documents/{second['document_id']}").status_code == 404
    # the deleted document's job is gone from the caller's view with it
    assert client.get(f"/v1/jobs/{second['job_id']}").status_code == 404
    assert settled(client, first["document_id"])["status"] == "ready"
    assert_no_orphan_files(server.home, {first["document_id"]})
