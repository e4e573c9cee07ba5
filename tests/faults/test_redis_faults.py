"""Redis paused and restarted under a distributed deployment (issue 13): during an ingest the
document still ends `ready` (or `failed` with a message, and deletable), during an answer the
stream ends with `done` or a clean `error` event, the probes never wait on Redis, and the
service answers again once Redis is back. Real `conduit serve`, a real Celery worker and a
real `redis-server` that keeps its data in an append-only file, so a restart loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

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

PERSISTENT = ["--appendonly", "yes", "--appendfsync", "always"]


@dataclass
class Deployment:
    """An API process, one worker and the Redis they share (restartable on its port)."""

    tmp: Path
    redis_url: str
    stop_redis: Callable[[], None]
    client: httpx.Client
    procs: list[subprocess.Popen[bytes]]

    def redis_pid(self) -> int:
        pid: int = redis.Redis.from_url(self.redis_url).info("server")["process_id"]
        return pid

    def restart_redis(self, down_s: float) -> None:
        """SIGKILL redis-server, wait `down_s`, start it again on the same port and data."""
        os.kill(self.redis_pid(), signal.SIGKILL)
        time.sleep(down_s)
        port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])
        self.redis_url, self.stop_redis = start_redis(self.tmp, port=port, args=PERSISTENT)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    redis_url, stop_redis = start_redis(tmp_path, args=PERSISTENT)
    home = tmp_path / "home"
    home.mkdir()
    worker = start_worker(home, redis_url, "worker.log")
    url, api = start_serve(home, {**FAST, "CONDUIT_REDIS_URL": redis_url})
    dep = Deployment(tmp_path, redis_url, stop_redis, httpx.Client(base_url=url, timeout=300),
                     [worker, api])
    try:
        yield dep
    finally:
        stop_processes(dep.procs)
        dep.stop_redis()


def _upload(client: httpx.Client, col: str, n: int) -> dict[str, str]:
    pages = [f"Shipment {i}: {i * 3} pallets of valves leave dock {i}." for i in range(n)]
    response = client.post(f"/v1/collections/{col}/documents",
                           files={"file": ("s.pdf", text_pdf(pages), "application/pdf")})
    assert response.status_code == 202, response.text
    up: dict[str, str] = response.json()
    return up


def _running(client: httpx.Client, job_id: str) -> bool:
    try:
        return bool(client.get(f"/v1/jobs/{job_id}").json()["status"] == "running")
    except (httpx.TransportError, ValueError, KeyError):
        return False


def _stream_events(client: httpx.Client, body: dict[str, object],
                   on_first_token: Callable[[], None]) -> list[tuple[str, str]]:
    """The (event, data) pairs of one streamed answer; `on_first_token()` runs once."""
    events: list[tuple[str, str]] = []
    event = ""
    with client.stream("POST", "/v1/query/stream", json=body) as r:
        if r.status_code != 200:
            return [("http", f"{r.status_code} {r.read().decode()}")]
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((event, line.removeprefix("data: ")))
                if event == "token" and sum(e == "token" for e, _ in events) == 1:
                    on_first_token()
    return events


def _healthz_ms(client: httpx.Client) -> float:
    start = time.monotonic()
    assert client.get("/healthz", timeout=5).status_code == 200
    return (time.monotonic() - start) * 1000


def _answers(client: httpx.Client, col: str) -> dict[str, object]:
    def ask() -> dict[str, object] | None:
        r = client.post("/v1/query", json={"collection_id": col, "question": "Which dock?",
                                           "top_k": 2, "max_new_tokens": 4})
        return r.json() if r.status_code == 200 else None
    got: dict[str, object] = wait_for(ask, 120, "an answer once Redis is back", every=1.0)
    return got


def test_redis_paused_during_ingest_and_answer(deployment: Deployment) -> None:
    client = deployment.client
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    up = _upload(client, col, 8)
    wait_for(lambda: _running(client, up["job_id"]), 600, "the worker to take the ingest")
    pid = deployment.redis_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        probes = [_healthz_ms(client) for _ in range(5)]
        time.sleep(4)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert max(probes) < 1000, probes  # the liveness probe never waits on Redis
    doc = settled(client, up["document_id"])
    assert doc["status"] == "ready", doc
    assert doc["pages_done"] == doc["pages_total"] == 8

    def pause_briefly() -> None:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(3)
        os.kill(pid, signal.SIGCONT)

    body = {"collection_id": col, "question": "Which dock?", "top_k": 2, "max_new_tokens": 24}
    events = _stream_events(client, body, pause_briefly)
    assert events[-1][0] in ("done", "error"), events[-3:]
    assert _answers(client, col)["citations"]


def test_redis_restarted_during_ingest_and_answer(deployment: Deployment) -> None:
    client = deployment.client
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    up = _upload(client, col, 8)
    wait_for(lambda: _running(client, up["job_id"]), 600, "the worker to take the ingest")
    deployment.restart_redis(down_s=3)
    doc = settled(client, up["document_id"])
    if doc["status"] == "failed":  # allowed, but then with a message, and deletable
        assert doc["error"], doc
        assert client.delete(f"/v1/documents/{up['document_id']}").status_code == 204
        up = _upload(client, col, 8)
        doc = settled(client, up["document_id"])
    assert doc["status"] == "ready", doc

    body = {"collection_id": col, "question": "Which dock?", "top_k": 2, "max_new_tokens": 24}
    events = _stream_events(client, body, lambda: deployment.restart_redis(down_s=1))
    assert events[-1][0] in ("done", "error"), events[-3:]
    if events[-1][0] == "error":
        assert events[-1][1].strip(), events[-1]  # an error event says what happened
    assert _answers(client, col)["citations"]
    assert job_status(client, up["job_id"]) == "succeeded"
