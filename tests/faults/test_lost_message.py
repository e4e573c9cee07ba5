"""Issue 70, item 1, distributed form: a Celery message lost with a frozen worker does not
strand its document. The frozen worker (SIGSTOP, as a node that stalls) is handed the upload's
message by Redis and never records it as taken; it is then killed and another started. Before:
the message was in neither the queue nor `unacked` and the document stayed `queued` for good;
now the reaper sends a queued job that the broker no longer holds again after one lease, and
the document is ingested once."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import redis

from lab.processes import start_redis, stop_processes
from storage.metadata import JobId, RedisMetadataStore
from tests.faults.conftest import FAST, settled, start_serve, start_worker, wait_for
from tests.pdfs import text_pdf
from tests.storage.kv_testkit import redis_entries

LEASE_S = float(FAST["CONDUIT_JOB_LEASE_S"])
REAPER_S = float(FAST["CONDUIT_REAPER_INTERVAL_S"])
INGEST_S = 120.0  # three text pages on the builtin model, on a shared 2-core machine


def _worker_ready(log: Path) -> bool:
    """Celery logs `celery@<host> ready.` once it consumes (after the model's preload)."""
    return log.exists() and b" ready." in log.read_bytes()


def test_a_message_lost_with_a_frozen_worker_is_sent_again(tmp_path: Path) -> None:
    redis_url, stop_redis = start_redis(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    procs: list[subprocess.Popen[bytes]] = [start_worker(home, redis_url, "worker1.log")]
    broker = redis.Redis.from_url(redis_url)
    try:
        url, api = start_serve(home, {**FAST, "CONDUIT_REDIS_URL": redis_url})
        procs.append(api)
        client = httpx.Client(base_url=url, timeout=300)
        wait_for(lambda: _worker_ready(home / "worker1.log"), 600, "the first worker")
        frozen = procs[0]
        frozen.send_signal(signal.SIGSTOP)  # blocked in BRPOP: Redis hands it the message
        col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
        pages = [f"Crate {i} holds {i * 7} brass fittings." for i in range(3)]
        up = client.post(f"/v1/collections/{col}/documents",
                         files={"file": ("c.pdf", text_pdf(pages), "application/pdf")}).json()
        wait_for(lambda: broker.llen("conduit.ingest") == 0, 60, "the frozen worker's pop")
        time.sleep(LEASE_S + 2 * REAPER_S)  # long enough for a reaper to act, if it would
        assert client.get(f"/v1/jobs/{up['job_id']}").json()["status"] == "queued"
        frozen.kill()  # SIGKILL: the message dies with it, unacknowledged nowhere
        frozen.wait(timeout=30)

        procs.append(start_worker(home, redis_url, "worker2.log"))
        wait_for(lambda: _worker_ready(home / "worker2.log"), 600, "the second worker")
        started = time.monotonic()
        bound = LEASE_S + REAPER_S + INGEST_S
        doc = settled(client, up["document_id"], timeout=bound)
        assert doc["status"] == "ready", doc
        assert time.monotonic() - started < bound

        # ingested once: one claim of the job, one KV entry per page, one listing entry
        meta = RedisMetadataStore(redis_url)
        assert meta.get_job(JobId(up["job_id"])).attempts == 1
        assert redis_entries(redis_url) == 3
        listed = client.get(f"/v1/collections/{col}/documents").json()
        assert [d["document_id"] for d in listed] == [up["document_id"]]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        stop_processes(procs)
        stop_redis()


def test_a_question_lost_with_a_frozen_worker_is_answered_once(tmp_path: Path) -> None:
    """The same for a question whose client waits: its message is sent again once the broker
    no longer holds it, and answered by one delivery (before: 503 after the queue wait)."""
    redis_url, stop_redis = start_redis(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    procs: list[subprocess.Popen[bytes]] = [start_worker(home, redis_url, "worker1.log")]
    broker = redis.Redis.from_url(redis_url)
    try:
        url, api = start_serve(home, {**FAST, "CONDUIT_REDIS_URL": redis_url,
                                      "CONDUIT_ANSWER_QUEUE_WAIT_S": "120"})
        procs.append(api)
        client = httpx.Client(base_url=url, timeout=600)
        col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
        up = client.post(f"/v1/collections/{col}/documents", files={"file": (
            "c.pdf", text_pdf(["The east gate opens at dawn."]), "application/pdf")}).json()
        assert settled(client, up["document_id"], timeout=600)["status"] == "ready"
        wait_for(lambda: _worker_ready(home / "worker1.log"), 600, "the first worker")
        frozen = procs[0]
        frozen.send_signal(signal.SIGSTOP)
        replies: list[httpx.Response] = []
        asking = threading.Thread(target=lambda: replies.append(client.post("/v1/query", json={
            "collection_id": col, "question": "When does the east gate open?",
            "max_new_tokens": 4})))
        asking.start()
        time.sleep(2)
        wait_for(lambda: broker.llen("conduit.answer") == 0, 60, "the frozen worker's pop")
        frozen.kill()
        frozen.wait(timeout=30)
        procs.append(start_worker(home, redis_url, "worker2.log"))
        asking.join(timeout=300)
        assert replies and replies[0].status_code == 200, replies and replies[0].text
        assert replies[0].json()["citations"][0]["document_id"] == up["document_id"]
        answered = (home / "worker2.log").read_bytes().count(b"Task conduit.answer[")
        assert answered >= 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        stop_processes(procs)
        stop_redis()
