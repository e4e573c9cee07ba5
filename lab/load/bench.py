"""`conduit-lab bench load`: closed-loop clients drive uploads and questions against a service on
loopback and report throughput, p50/p95/p99 latency and time to first token, errors, `/healthz`
latency under the load, and peak RSS of the service and its workers against a stated bound.

Either against a running service (`--url`, `--pid` for RSS) or spawning one itself, in each
form of `--form embedded,distributed` (embedded: one process; distributed: Redis, two Celery
workers and the API) with each answer engine of `--engine serial,batched`, one service after
the other on a temporary home (`--model` is passed to it as `CONDUIT_MODEL`). Against each
service, every value of `--upload-every` (e.g. `0,10`) runs its own set of load levels
(`--clients`), in the order given: each client loops, every n-th request uploads a small PDF
into the questions' collection (client i's first at request n - (i mod n), so that uploads
are spread from the start; 0 = questions only), the others ask a streamed question
(`--top-k`, `--max-new-tokens`; TTFT = the first token event; `tokens_per_answer` and
`output_tokens_per_s` count the token events, since an answer may stop before its cap and
answers/s alone would then compare answers of different lengths). A prober process GETs
`/healthz` every 0.05 s (`healthz_latency_s`: what a liveness probe, its own process, sees;
about 400 probes in a 20 s level, so that its p99 is not one outlier's share of the
interpolation between the two largest of 100, as at the 0.2 s it used before 2026-12-03);
a prober thread among the clients GETs it every 0.2 s (`healthz_in_load_latency_s`: it also waits
for the load generator's own interpreter lock, which 32 client threads hold most of the
time). Results append to `--out` as one JSON object per level;
`lab.load.report` turns them into markdown tables and a plot.

Engines (`lab.load.services.ENGINES`, which also spawns the services): serial is
`CONDUIT_MAX_ACTIVE_ANSWERS=1`: each model process's engine decodes one answer at a time (a
distributed worker then runs `worker_threads` = 1 + (2 - 1) = 2 task threads: one answer slot,
one for an ingest beside it; with prefetch 1 it holds at most two tasks, a second answer
waiting in its engine's queue); batched is the default (16 slots).

Memory: each row's peak RSS per role against a stated bound (`lab.load.memory`).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import pymupdf

from lab.load.memory import group_rss_kb, kv_bytes_per_token, rss_bounds
from lab.load.services import FORM_LABELS, Service, service_settings, spawned

PROBE_INTERVAL_S = 0.05  # the prober process's /healthz interval

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
    tokens: list[int] = field(default_factory=list)  # token events of each answer
    upload: list[float] = field(default_factory=list)
    healthz: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    details: dict[str, int] = field(default_factory=dict)  # the messages of error events
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, kind: str, detail: str | None = None) -> None:
        """Count one error of `kind` (e.g. `query:503`, `upload:ReadTimeout`) and its
        message when the service gave one."""
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1
            if detail is not None:
                self.details[detail[:200]] = self.details.get(detail[:200], 0) + 1


@dataclass(frozen=True)
class Ask:
    """What each client does: every `upload_every`-th request an upload (0 = never), the
    others a question retrieving `top_k` pages and answering up to `max_new_tokens`."""

    upload_every: int = 10
    max_new_tokens: int = 64
    top_k: int = 2


def upload_once(client: httpx.Client, collection: str, tally: Tally, seed: int) -> None:
    """Upload one small PDF (content from `seed`) into `collection`; its latency or error
    goes to `tally`."""
    t0 = time.perf_counter()
    try:
        r = client.post(f"/v1/collections/{collection}/documents", files={
            "file": ("load.pdf", _pdf(seed), "application/pdf")})
        if r.status_code == 202:
            with tally.lock:
                tally.upload.append(time.perf_counter() - t0)
        else:
            tally.error(f"upload:{r.status_code}")
    except httpx.HTTPError as exc:
        tally.error(f"upload:{type(exc).__name__}")


def ask_once(client: httpx.Client, collection: str, question: str, ask: Ask,
             tally: Tally) -> tuple[float, float | None] | None:
    """Ask one streamed question; its (latency, TTFT) in seconds also go to `tally`, with its
    token count. None (and an error counted) when it failed."""
    body = {"collection_id": collection, "question": question, "top_k": ask.top_k,
            "max_new_tokens": ask.max_new_tokens}
    t0 = time.perf_counter()
    first: float | None = None
    try:
        with client.stream("POST", "/v1/query/stream", json=body) as r:
            if r.status_code != 200:
                tally.error(f"query:{r.status_code}")
                return None
            last = ""
            detail = None
            tokens = 0
            for line in r.iter_lines():
                if line.startswith("event: "):
                    last = line.removeprefix("event: ")
                    tokens += last == "token"
                    if last == "token" and first is None:
                        first = time.perf_counter() - t0
                elif last == "error" and line.startswith("data: "):
                    detail = line.removeprefix("data: ")
            if last != "done":
                tally.error(f"query:event-{last or 'none'}", detail)
                return None
        latency = time.perf_counter() - t0
        with tally.lock:
            tally.query.append(latency)
            tally.tokens.append(tokens)
            if first is not None:
                tally.ttft.append(first)
        return latency, first
    except httpx.HTTPError as exc:
        tally.error(f"query:{type(exc).__name__}")
        return None


def question_text(rng: random.Random) -> str:
    """A question of six load words (retrieval finds the seed document's pages)."""
    return " ".join(rng.choice(WORDS) for _ in range(6)) + "?"


def _client_loop(url: str, headers: dict[str, str], collection: str, stop: threading.Event,
                 tally: Tally, seed: int, ask: Ask) -> None:
    upload_every = ask.upload_every
    rng = random.Random(seed)
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        n = 0
        while not stop.is_set():
            n += 1
            # client `seed` uploads at its (n + seed)-th request: the clients' uploads are
            # spread from the start, so a level whose clients make fewer than n requests
            # each still uploads at the stated rate
            if upload_every and (n + seed) % upload_every == 0:
                upload_once(client, collection, tally, rng.randrange(1 << 30))
            else:
                ask_once(client, collection, question_text(rng), ask, tally)


def _probe_once(client: httpx.Client) -> float | None:
    """One GET /healthz: its latency in seconds, or None when it failed."""
    t0 = time.perf_counter()
    try:
        ok = client.get("/healthz").status_code == 200
    except httpx.HTTPError:
        ok = False
    return time.perf_counter() - t0 if ok else None


def _prober(url: str, stop: threading.Event, tally: Tally) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.wait(0.2):
            latency = _probe_once(client)
            if latency is None:
                tally.error("healthz_in_load")
                continue
            with tally.lock:
                tally.healthz.append(latency)


def probe_healthz(url: str, interval_s: float, conn: Connection) -> None:
    """The prober process: say "ready", GET `/healthz` every `interval_s` until `conn`
    receives anything, then send back (latencies in seconds, failed probes)."""
    latencies: list[float] = []
    failed = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        conn.send("ready")
        while not conn.poll(interval_s):
            latency = _probe_once(client)
            if latency is None:
                failed += 1
            else:
                latencies.append(latency)
    conn.send((latencies, failed))


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
             ask: Ask | None = None) -> dict[str, Any]:
    """Drive `clients` closed-loop clients doing `ask` for `duration_s`; return the
    measurements."""
    headers = headers or {}
    ask = ask or Ask()
    tally = Tally()
    stop = threading.Event()
    threads = [threading.Thread(target=_client_loop, daemon=True,
                                args=(url, headers, collection, stop, tally, i, ask))
               for i in range(clients)]
    threads.append(threading.Thread(target=_prober, args=(url, stop, tally), daemon=True))
    spawn = multiprocessing.get_context("spawn")
    probe_conn, child_conn = spawn.Pipe()
    prober = spawn.Process(target=probe_healthz, args=(url, PROBE_INTERVAL_S, child_conn),
                            daemon=True)
    prober.start()
    if not probe_conn.poll(120) or probe_conn.recv() != "ready":  # probes cover the whole load
        raise RuntimeError("the /healthz prober process did not start")
    peak = {name: 0 for name in pids}
    own = {name: 0 for name in pids}  # the role's processes alone, without reader children

    def sample() -> None:
        for name, group in pids.items():
            peak[name] = max(peak[name], group_rss_kb(group))
            own[name] = max(own[name], group_rss_kb(group, children=False))

    t0 = time.perf_counter()
    for t in threads:
        t.start()
    while time.perf_counter() - t0 < duration_s:
        sample()
        time.sleep(0.5)
    stop.set()
    probe_conn.send("stop")  # the probes cover the load window, not the tail of answers
    probes, probe_failures = probe_conn.recv()
    prober.join(timeout=30)
    if probe_failures:
        with tally.lock:
            tally.errors["healthz"] = tally.errors.get("healthz", 0) + probe_failures
    while any(t.is_alive() for t in threads) and time.perf_counter() - t0 < duration_s + 600:
        sample()  # the answers still running count too
        time.sleep(0.2)
    elapsed = time.perf_counter() - t0
    done = len(tally.query) + len(tally.upload)
    return {
        "clients": clients, "duration_s": round(elapsed, 2),
        "throughput_rps": round(done / elapsed, 3),
        "tokens_per_answer": round(sum(tally.tokens) / len(tally.tokens), 2)
        if tally.tokens else None,
        "output_tokens_per_s": round(sum(tally.tokens) / elapsed, 1),
        "query_latency_s": percentiles(tally.query), "ttft_s": percentiles(tally.ttft),
        "upload_latency_s": percentiles(tally.upload),
        "healthz_latency_s": percentiles(probes),
        "healthz_in_load_latency_s": percentiles(tally.healthz), "errors": dict(tally.errors),
        "error_details": dict(tally.details),
        "peak_rss_mb": {k: round(v / 1024, 1) for k, v in peak.items()},
        "peak_process_rss_mb": {k: round(v / 1024, 1) for k, v in own.items()},
    }


def main(*, url: str | None, clients: list[int], duration_s: float, pids: list[int],
         key: str | None, out: Path, upload_every: list[int] | None = None,
         forms: list[str] | None = None, engines: list[str] | None = None,
         max_new_tokens: int = 64, top_k: int = 2, model: str | None = None,
         keep_logs: Path | None = None) -> list[dict[str, Any]]:
    """Against a service per (form, engine) of `forms` x `engines`, spawned one after the
    other (or the one at `url`), run one load level per entry of `clients` for each value of
    `upload_every` (default [10]); append each result to `out` (JSON lines) and return them."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    results: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop spawned processes too

    def levels(base: str, roles: dict[str, list[int]], labels: dict[str, Any],
               bound: Callable[[dict[str, float]], dict[str, float]] | None) -> None:
        collection = prepare(base, headers)
        baseline = {r: round(group_rss_kb(g, children=False) / 1024, 1)
                    for r, g in roles.items()}
        bounds = bound(baseline) if bound else None
        for every in upload_every or [10]:
            for c in clients:
                load = run_load(base, clients=c, duration_s=duration_s, pids=roles,
                                collection=collection, headers=headers,
                                ask=Ask(every, max_new_tokens, top_k))
                row = {**labels, "upload_every": every, "max_new_tokens": max_new_tokens,
                       "top_k": top_k, "command": " ".join(sys.argv), **load,
                       "rss_baseline_mb": baseline, "rss_bound_mb": bounds,
                       "rss_within_bound": None if bounds is None else
                       {r: load["peak_process_rss_mb"][r] <= b for r, b in bounds.items()}}
                print(json.dumps(row), flush=True)
                results.append(row)
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")

    if url:
        levels(url, {"service": pids}, {"form": "external", "engine": "external",
                                        "model": model}, None)
        return results
    settings = service_settings(model)
    for form in forms or ["embedded"]:
        for engine in engines or ["batched"]:
            with spawned(form, engine=engine, model=model, keep_logs=keep_logs) as svc:
                def bound(baseline: dict[str, float], svc: Service = svc) -> dict[str, float]:
                    # after prepare: the service has materialised a builtin model
                    core = settings.core
                    kv = kv_bytes_per_token(core.model, core.torch_dtype, svc.home)
                    return rss_bounds(baseline, svc.engines,
                                      settings.worker.max_kv_tokens_in_flight, kv,
                                      settings.storage.memory_kv_bytes)

                levels(svc.url, svc.pids,
                       {"form": FORM_LABELS[form], "engine": engine, "model": settings.core.model},
                       bound)
    return results
