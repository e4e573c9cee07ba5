"""`conduit-lab bench load`: closed-loop clients drive uploads and questions against a service on
loopback and report throughput, p50/p95/p99 latency and time to first token, errors, `/healthz`
latency under the load, and peak RSS of the service and its workers.

Either against a running service (`--url`, `--pid` for RSS) or spawning one itself
(`--spawn`: embedded, or `--distributed`: Redis, two Celery workers and the API) on a
temporary home. Each client loops: every `--upload-every`-th request uploads a small PDF, the
others ask a streamed question (TTFT = the first token event). A prober thread GETs
`/healthz` every 0.2 s. Results append to `--out` as one JSON object per run. `--engine
serial,batched` runs each load level against a service with each answer engine in turn
(serial: `CONDUIT_MAX_ACTIVE_ANSWERS=1`, one answer at a time; batched: the default), and
`lab.load.report` turns the rows into a markdown table and a plot.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pymupdf

from lab.processes import free_port, start_redis, stop_processes

WORDS = ["pump", "valve", "turbine", "invoice", "freight", "ledger", "audit", "reactor",
         "harbour", "pressure", "quarterly", "revenue", "inspection", "maintenance"]


def _pdf(seed: int, pages: int = 2) -> bytes:
    rng = random.Random(seed)
    doc = pymupdf.open()
    for _ in range(pages):
        page = doc.new_page(width=595, height=842)
        text = " ".join(rng.choice(WORDS) for _ in range(40))
        page.insert_textbox(pymupdf.Rect(50, 60, 545, 800), text, fontsize=14)
    data: bytes = doc.tobytes()
    doc.close()
    return data


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """count, p50, p95, p99 and max (seconds, rounded) of `values`."""
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else \
        [values[0]] * 99
    return {"count": len(values), "p50": round(q[49], 4), "p95": round(q[94], 4),
            "p99": round(q[98], 4), "max": round(max(values), 4)}


@dataclass
class Tally:
    """Latencies and errors gathered by all client threads."""

    query: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    upload: list[float] = field(default_factory=list)
    healthz: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, kind: str) -> None:
        """Count one error of `kind` (e.g. `query:503`, `upload:ReadTimeout`)."""
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1


def _rss_kb(pid: int) -> int:
    """Resident set of a process and its children, in KiB (0 if gone)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(ln.split()[1] for ln in status.splitlines()
                              if ln.startswith("VmRSS:")))
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except (OSError, StopIteration, ValueError):
            continue
    return total


def _client_loop(url: str, headers: dict[str, str], collection: str, stop: threading.Event,
                 tally: Tally, seed: int, upload_every: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        n = 0
        while not stop.is_set():
            n += 1
            if upload_every and n % upload_every == 0:
                t0 = time.perf_counter()
                try:
                    r = client.post(f"/v1/collections/{collection}/documents", files={
                        "file": ("load.pdf", _pdf(rng.randrange(1 << 30)), "application/pdf")})
                    if r.status_code == 202:
                        with tally.lock:
                            tally.upload.append(time.perf_counter() - t0)
                    else:
                        tally.error(f"upload:{r.status_code}")
                except httpx.HTTPError as exc:
                    tally.error(f"upload:{type(exc).__name__}")
                continue
            question = " ".join(rng.choice(WORDS) for _ in range(6)) + "?"
            body = {"collection_id": collection, "question": question, "top_k": 2,
                    "max_new_tokens": 8}
            t0 = time.perf_counter()
            first: float | None = None
            try:
                with client.stream("POST", "/v1/query/stream", json=body) as r:
                    if r.status_code != 200:
                        tally.error(f"query:{r.status_code}")
                        continue
                    last = ""
                    for line in r.iter_lines():
                        if line.startswith("event: "):
                            last = line.removeprefix("event: ")
                            if last == "token" and first is None:
                                first = time.perf_counter() - t0
                    if last != "done":
                        tally.error(f"query:event-{last or 'none'}")
                        continue
                with tally.lock:
                    tally.query.append(time.perf_counter() - t0)
                    if first is not None:
                        tally.ttft.append(first)
            except httpx.HTTPError as exc:
                tally.error(f"query:{type(exc).__name__}")


def _prober(url: str, stop: threading.Event, tally: Tally) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.wait(0.2):
            t0 = time.perf_counter()
            try:
                ok = client.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                with tally.lock:
                    tally.healthz.append(time.perf_counter() - t0)
            else:
                tally.error("healthz")


def prepare(url: str, headers: dict[str, str], timeout: float = 900) -> str:
    """A collection holding one ready document (the questions' scope); returns its id."""
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        name = f"load-{int(time.time() * 1000)}"
        col = str(client.post("/v1/collections", json={"name": name}).json()["collection_id"])
        up = client.post(f"/v1/collections/{col}/documents",
                         files={"file": ("seed.pdf", _pdf(0, pages=4), "application/pdf")})
        doc = up.json()["document_id"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = client.get(f"/v1/documents/{doc}").json()["status"]
            if status == "ready":
                return col
            if status == "failed":
                raise RuntimeError("the seed document failed to ingest")
            time.sleep(0.5)
    raise TimeoutError("the seed document did not become ready")


def run_load(url: str, *, clients: int, duration_s: float, pids: dict[str, list[int]],
             collection: str, headers: dict[str, str] | None = None,
             upload_every: int = 10) -> dict[str, Any]:
    """Drive `clients` closed-loop clients for `duration_s`; return the measurements."""
    headers = headers or {}
    tally = Tally()
    stop = threading.Event()
    threads = [threading.Thread(target=_client_loop, daemon=True,
                                args=(url, headers, collection, stop, tally, i, upload_every))
               for i in range(clients)]
    threads.append(threading.Thread(target=_prober, args=(url, stop, tally), daemon=True))
    peak = {name: 0 for name in pids}
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    while time.perf_counter() - t0 < duration_s:
        for name, group in pids.items():
            peak[name] = max(peak[name], sum(_rss_kb(p) for p in group))
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=600)
    elapsed = time.perf_counter() - t0
    done = len(tally.query) + len(tally.upload)
    return {
        "clients": clients, "duration_s": round(elapsed, 2),
        "throughput_rps": round(done / elapsed, 3),
        "query_latency_s": percentiles(tally.query), "ttft_s": percentiles(tally.ttft),
        "upload_latency_s": percentiles(tally.upload),
        "healthz_latency_s": percentiles(tally.healthz), "errors": dict(tally.errors),
        "peak_rss_mb": {k: round(v / 1024, 1) for k, v in peak.items()},
    }


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the service exited during startup")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise TimeoutError("the service did not start")


# the answer engine a spawned service runs: one answer at a time, or the batched default
ENGINES: dict[str, dict[str, str]] = {"serial": {"CONDUIT_MAX_ACTIVE_ANSWERS": "1"},
                                      "batched": {}}


@contextmanager
def spawned(distributed: bool, workers: int = 2, engine: str = "batched"
            ) -> Iterator[tuple[str, dict[str, list[int]]]]:
    """A service on a temporary home: embedded, or Redis + `workers` Celery workers + API,
    with the `engine` of `ENGINES`. Yields (URL, pids by role)."""
    with tempfile.TemporaryDirectory(prefix="conduit-load-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1",
               "CONDUIT_OCR": "false", **ENGINES[engine]}
        procs: list[subprocess.Popen[bytes]] = []
        stop_redis = None
        try:
            pids: dict[str, list[int]] = {"service": []}
            if distributed:
                env["CONDUIT_REDIS_URL"], stop_redis = start_redis(Path(tmp))
                pids["workers"] = []
                for i in range(workers):
                    w = subprocess.Popen([sys.executable, "-m", "service.cli", "worker",
                                          "--concurrency", "2"], env=env,
                                         stdout=open(home / f"worker{i}.log", "wb"),  # noqa: SIM115
                                         stderr=subprocess.STDOUT)
                    procs.append(w)
                    pids["workers"].append(w.pid)
            port = free_port()
            api = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port",
                                    str(port)], env=env,
                                   stdout=open(home / "server.log", "wb"),  # noqa: SIM115
                                   stderr=subprocess.STDOUT)
            procs.append(api)
            pids["service"].append(api.pid)
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, api)
            yield url, pids
        finally:
            stop_processes(procs)
            if stop_redis:
                stop_redis()


def main(*, url: str | None, clients: list[int], duration_s: float, distributed: bool,
         pids: list[int], key: str | None, out: Path, upload_every: int,
         engines: list[str] | None = None) -> list[dict[str, Any]]:
    """Run one load level per entry of `clients` (per engine of `engines`, side by side, on
    services spawned one after the other); append each result to `out` (JSON lines)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    results: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop spawned processes too

    def levels(base: str, roles: dict[str, list[int]], form: str, engine: str) -> None:
        collection = prepare(base, headers)
        for c in clients:
            row = {"form": form, "engine": engine, "upload_every": upload_every,
                   "command": " ".join(sys.argv),
                   **run_load(base, clients=c, duration_s=duration_s, pids=roles,
                              collection=collection, headers=headers,
                              upload_every=upload_every)}
            print(json.dumps(row), flush=True)
            results.append(row)
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")

    if url:
        levels(url, {"service": pids}, "external", "external")
    else:
        for engine in engines or ["batched"]:
            with spawned(distributed, engine=engine) as (base, roles):
                levels(base, roles, "distributed (2 workers)" if distributed else "embedded",
                       engine)
    return results
