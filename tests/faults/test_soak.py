"""The distributed soak of issue 70 (marked slow: `pytest -m slow tests/faults/test_soak.py`).

For `CONDUIT_SOAK_S` seconds (600 by default) a client uploads documents and asks questions
while the chaos loop freezes a worker (SIGSTOP, then SIGCONT or SIGKILL), kills and restarts
workers, and restarts Redis once (its data kept in an append-only file). Then every document
must end ready or failed with a message, every reply must be below 500 but the documented 503s,
and no document is listed twice or holds pages beyond its count."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from lab.processes import start_redis, stop_processes
from tests.faults.conftest import FAST, settled, start_serve, start_worker
from tests.pdfs import text_pdf

PERSISTENT = ["--appendonly", "yes", "--appendfsync", "always"]
SOAK_S = float(os.environ.get("CONDUIT_SOAK_S", "600"))


class Load:
    """Uploads and questions from one thread; the status codes it saw and the documents."""

    def __init__(self, client: httpx.Client, collection: str) -> None:
        self.client, self.collection = client, collection
        self.codes: list[int] = []
        self.documents: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _call(self, method: str, path: str, **kw: object) -> httpx.Response | None:
        try:
            r = self.client.request(method, path, **kw)  # type: ignore[arg-type]
        except httpx.TransportError:  # a refused connection is not a reply
            return None
        self.codes.append(r.status_code)
        return r

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            pages = [f"Report {i}, part {p}: crate {i * 10 + p} ships on day {p + 1}."
                     for p in range(1 + i % 3)]
            r = self._call("POST", f"/v1/collections/{self.collection}/documents",
                           files={"file": (f"r{i}.pdf", text_pdf(pages), "application/pdf")})
            if r is not None and r.status_code == 202:
                self.documents.append(r.json()["document_id"])
            self._call("POST", "/v1/query", json={
                "collection_id": self.collection, "question": f"When does crate {i} ship?",
                "max_new_tokens": 4})
            i += 1
            time.sleep(1)


@pytest.mark.slow
def test_soak_with_frozen_killed_workers_and_a_redis_restart(tmp_path: Path) -> None:
    redis_url, stop_redis = start_redis(tmp_path, args=PERSISTENT)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    home = tmp_path / "home"
    home.mkdir()
    workers = [start_worker(home, redis_url, f"worker{i}.log") for i in range(2)]
    procs: list[subprocess.Popen[bytes]] = list(workers)
    rng = random.Random(70)
    try:
        url, api = start_serve(home, {**FAST, "CONDUIT_REDIS_URL": redis_url,
                                      "CONDUIT_ANSWER_QUEUE_WAIT_S": "60"})
        procs.append(api)
        client = httpx.Client(base_url=url, timeout=300)
        col = client.post("/v1/collections", json={"name": "soak"}).json()["collection_id"]
        load = Load(client, col)
        load.thread.start()
        began, restarted, n = time.monotonic(), False, len(workers)
        while time.monotonic() - began < SOAK_S:
            time.sleep(rng.uniform(10, 30))
            victim = rng.randrange(len(workers))
            action = rng.choice(["freeze", "kill"])
            if not restarted and time.monotonic() - began > SOAK_S / 2:
                pid = redis.Redis.from_url(redis_url).info("server")["process_id"]
                os.kill(pid, signal.SIGKILL)
                time.sleep(2)
                redis_url, stop_redis = start_redis(tmp_path, port=port, args=PERSISTENT)
                restarted = True
                continue
            if action == "freeze":
                workers[victim].send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(2, 8))
                if rng.random() < 0.5:
                    workers[victim].send_signal(signal.SIGCONT)
                    continue
                workers[victim].kill()
            else:
                workers[victim].kill()
            workers[victim].wait(timeout=30)
            workers[victim] = start_worker(home, redis_url, f"worker{n}.log")
            procs.append(workers[victim])
            n += 1
        load.stop.set()
        load.thread.join(timeout=600)
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        docs = [settled(client, d, timeout=900) for d in load.documents]
        listed: list[str] = []
        cursor: str | None = None
        while True:
            r = client.get(f"/v1/collections/{col}/documents",
                           params={"limit": 1000, **({"after": cursor} if cursor else {})})
            listed += [d["document_id"] for d in r.json()]
            if (cursor := r.headers.get("x-next-cursor")) is None:
                break
    finally:
        stop_processes(procs)
        stop_redis()
    assert restarted and docs, (restarted, len(docs))
    assert all(d["status"] == "ready" or d["error"] for d in docs), docs
    assert [c for c in load.codes if c >= 500 and c != 503] == [], sorted(set(load.codes))
    assert len(listed) == len(set(listed))
    assert all(d["pages_done"] <= d["pages_total"] for d in docs)
