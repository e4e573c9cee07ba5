"""Findings 2 and 3 in the distributed form: a Celery worker SIGKILLed mid-ingest leaves its
job to the second worker within one lease (before: the message waited for Redis' 3,600 s
visibility timeout and the document stayed `processing`), and a worker killed mid-answer ends
the stream with a clean error instead of a hang."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from lab.processes import start_redis, stop_processes
from tests.faults.conftest import (
    FAST,
    job_status,
    settled,
    start_serve,
    start_worker,
    wait_for,
)
from tests.pdfs import text_pdf


@contextlib.contextmanager
def _distributed(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]],
                                                   httpx.Client]]:
    """Redis, one worker and the API on a shared home: (redis URL, [worker, api], client);
    everything started later and appended to the list is stopped too."""
    redis_url, stop_redis = start_redis(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    procs = [start_worker(home, redis_url, "worker1.log")]
    try:
        url, api = start_serve(home, {**FAST, "CONDUIT_REDIS_URL": redis_url})
        procs.append(api)
        yield redis_url, procs, httpx.Client(base_url=url, timeout=300)
    finally:
        stop_processes(procs)
        stop_redis()


def test_worker_sigkill_mid_ingest_and_mid_answer(tmp_path: Path) -> None:
    with _distributed(tmp_path) as (redis_url, procs, client):
        first, home = procs[0], tmp_path / "home"
        col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
        pages = [f"Shipment {i}: {i * 3} pallets of valves leave dock {i}." for i in range(6)]
        up = client.post(f"/v1/collections/{col}/documents",
                         files={"file": ("s.pdf", text_pdf(pages), "application/pdf")}).json()
        wait_for(lambda: client.get(f"/v1/jobs/{up['job_id']}").json()["status"] == "running",
                 600, "the first worker to take the ingest")
        second = start_worker(home, redis_url, "worker2.log")
        procs.append(second)
        first.send_signal(signal.SIGKILL)  # mid-ingest: its message stays unacknowledged
        first.wait(timeout=30)
        doc = settled(client, up["document_id"], timeout=900)
        assert doc["status"] == "ready", doc
        assert job_status(client, up["job_id"]) == "succeeded"

        # mid-answer: the only worker dies after the first token; the stream ends cleanly
        body = {"collection_id": col, "question": "Which dock?", "top_k": 2,
                "max_new_tokens": 2048}
        events: list[str] = []
        start = time.monotonic()
        with client.stream("POST", "/v1/query/stream", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("event: "):
                    events.append(line.removeprefix("event: "))
                    if events[-1] == "token" and second.poll() is None:
                        second.send_signal(signal.SIGKILL)
                if line.startswith("data: ") and events and events[-1] == "error":
                    assert "stopped" in line or "no worker" in line, line
        assert events[-1] in ("error", "done"), events
        assert time.monotonic() - start < 120
        assert client.get("/healthz").status_code == 200


def test_openai_stream_ends_with_an_error_event_when_its_worker_dies(tmp_path: Path) -> None:
    with _distributed(tmp_path) as (_, procs, client):
        worker = procs[0]
        col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
        up = client.post(f"/v1/collections/{col}/documents",
                         files={"file": ("s.pdf", text_pdf(["Dock 4 ships valves."]),
                                         "application/pdf")}).json()
        assert settled(client, up["document_id"], timeout=900)["status"] == "ready"
        body = {"model": f"conduit:{col}", "stream": True, "max_tokens": 2048,
                "messages": [{"role": "user", "content": "Which dock?"}]}
        data: list[str] = []
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data.append(line.removeprefix("data: "))
                    if '"content"' in data[-1] and worker.poll() is None:
                        worker.send_signal(signal.SIGKILL)  # after the first token
        assert data[-1] == "[DONE]", data[-3:]
        error = json.loads(data[-2])["error"]
        assert error["message"] and error["type"] == "server_error", error
        assert client.get("/healthz").status_code == 200
