"""The upload fuzz through HTTP (`python -m lab.fuzz.uploads --http`, issue 30): the same
mutants as the direct mode (`uploads.py`) uploaded to a real embedded `conduit serve`.

The service is started as the service tests start it (`lab/service_process.py`
`start_server`, the tiny test model, OCR off, a 64 MiB upload limit) on a fresh home. Every
mutant is uploaded in turn; each reply must be a 202 or a 4xx whose body is strict UTF-8 JSON
with readable strings (no lone surrogates), never a 5xx. Then every accepted document must
reach `ready` or `failed`, each within `--stuck-after` seconds of the one before it (the
embedded runner ingests one document at a time, in order), else it counts as stuck. Last,
`GET /v1/documents/{id}` and `/v1/jobs/{id}` for every document, `/pages` for every ready
one, and `GET /v1/collections/{id}/documents` must answer 200 with readable bodies. The API
process's peak RSS is its VmHWM (`/proc/<pid>/status`), read before it is stopped. A server
that dies is counted as a crash and started again on the same home.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lab.fuzz.mutants import fuzz_sources, hwm_kib, mutants, mutate
from lab.service_process import start_server, stop_server, wait_ready

SERVER_ENV = {"CONDUIT_MODEL": "builtin:tiny-qwen2-vl", "CONDUIT_OCR": "false",
              "CONDUIT_MAX_UPLOAD_BYTES": str(64 * 2**20), "TRANSFORMERS_OFFLINE": "1"}


def unreadable(value: Any) -> str | None:
    """Where `value` (decoded JSON) holds a string that is not valid UTF-8 (a lone
    surrogate, from a `\\udcxx` escape), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return repr(value)[:200]
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        found = unreadable(item)
        if found is not None:
            return found
    return None


def reply_problem(r: httpx.Response, ok: tuple[int, ...] = (200,)) -> str | None:
    """What is wrong with a reply (None: nothing): a status outside `ok` that is not a 4xx
    with a message, a body that is not strict UTF-8 JSON, or a string in it that is not
    valid UTF-8."""
    if r.status_code not in ok and not 400 <= r.status_code < 500:
        return f"status {r.status_code}: {r.content[:200]!r}"
    try:
        body = json.loads(r.content.decode("utf-8"))  # strict
    except (UnicodeDecodeError, ValueError) as exc:
        return f"status {r.status_code}, body not UTF-8 JSON ({exc}): {r.content[:200]!r}"
    found = unreadable(body)
    if found is not None:
        return f"status {r.status_code}, unreadable string {found}"
    if r.status_code not in ok and not (isinstance(body, dict) and body.get("detail")):
        return f"status {r.status_code} without a message: {r.content[:200]!r}"
    return None


class _Service:
    """The embedded service under test: started, restarted after a crash, its peak kept."""

    def __init__(self, home: Path, args: argparse.Namespace) -> None:
        self.home = home
        self.env = {**SERVER_ENV, "CONDUIT_PAGE_MEMORY_MB": str(args.memory_mb),
                    "CONDUIT_PAGE_TIMEOUT_S": str(args.page_seconds),
                    "CONDUIT_INGEST_TIMEOUT_S": str(args.deadline)}
        self.peaks: list[int] = []
        self.baselines: list[int] = []
        self.crash_logs: list[str] = []
        self.start()

    def start(self) -> None:
        self.url, self.proc = start_server(self.home, self.env)
        self.baselines.append(hwm_kib(self.proc.pid))
        self.client = httpx.Client(base_url=self.url, timeout=600)

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        self.crash_logs.append((self.home / "server.log").read_text(errors="replace")[-2000:])
        return False

    def restart(self) -> None:
        self.client.close()
        self.start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.peaks.append(hwm_kib(self.proc.pid))
        self.client.close()
        stop_server(self.proc)


def fuzz_http(args: argparse.Namespace) -> dict[str, Any]:
    """Upload every mutant of the plan to a fresh embedded service; return the figures."""
    sources = dict(fuzz_sources(args))
    names = sorted(sources)
    home = Path(tempfile.mkdtemp(prefix="conduit-fuzz-http-"))
    started = time.monotonic()
    service = _Service(home, args)
    try:
        col = service.client.post("/v1/collections", json={"name": "fuzz"}).json()
        rows = _upload_all(service, args, sources, names, col["collection_id"])
        stuck = _settle(service, rows, args.stuck_after)
        listing = _read_back(service, rows, col["collection_id"])
    finally:
        service.stop()
        if not args.keep_home:
            shutil.rmtree(home, ignore_errors=True)
    return _figures(args, service, rows, stuck, listing, time.monotonic() - started)


def _upload_all(service: _Service, args: argparse.Namespace, sources: dict[str, bytes],
                names: list[str], col: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for index, (name, label, seed) in enumerate(mutants(args.seed, args.count,
                                                        list(sources.items()))):
        rng = random.Random(seed)
        kind, data = mutate(rng, sources[name], sources[rng.choice(names)])
        row: dict[str, Any] = {"i": index, "source": name, "mutation": kind, "seed": label,
                               "bytes": len(data)}
        t0 = time.monotonic()
        try:
            r = service.client.post(f"/v1/collections/{col}/documents",
                                    files={"file": (f"fuzz-{index}.pdf", data,
                                                    "application/pdf")})
        except httpx.TransportError as exc:
            row.update(outcome="crash" if not service.alive() else "transport",
                       error=f"{type(exc).__name__}: {exc}"[:300])
            if row["outcome"] == "crash":
                service.restart()
        else:
            row.update(status=r.status_code, problem=reply_problem(r, ok=(202,)))
            body = r.json() if row["problem"] is None else {}
            if r.status_code == 202 and row["problem"] is None:
                row.update(outcome="accepted", document_id=body["document_id"],
                           job_id=body["job_id"])
            else:
                row.update(outcome="refused" if row["problem"] is None else "bad_reply",
                           message=str(body.get("detail", ""))[:300])
        row["upload_s"] = round(time.monotonic() - t0, 2)
        rows.append(row)
    return rows


def _settle(service: _Service, rows: list[dict[str, Any]], stuck_after: float) -> int:
    """Wait for every accepted document in upload order, each for `stuck_after` seconds
    after the one before settled; return how many did not settle (stuck)."""
    stuck = 0
    for row in rows:
        if row["outcome"] != "accepted":
            continue
        t0 = time.monotonic()
        try:
            doc = wait_ready(service.client, row["document_id"], timeout=stuck_after)
        except TimeoutError:
            row["ingest"] = "stuck"
            stuck += 1
            continue
        except (httpx.HTTPError, KeyError, ValueError) as exc:  # a 500 while polling, or a crash
            row.update(ingest="poll_error", error=f"{type(exc).__name__}: {exc}"[:300])
            if not service.alive():
                row["ingest"] = "crash"
                service.restart()
            continue
        row.update(ingest=doc["status"], pages=doc["pages_total"],
                   skipped=len(doc["skipped_pages"]), wait_s=round(time.monotonic() - t0, 2),
                   api_hwm_kib=hwm_kib(service.proc.pid))
        if doc["status"] == "failed":
            row["error"] = str(doc["error"])[:300]
    return stuck


def _read_back(service: _Service, rows: list[dict[str, Any]], col: str) -> dict[str, Any]:
    """GET every document, its job, a ready one's pages and the collection's listing; each
    must answer 200 with a readable body. Records each problem in its row."""
    gets = 0
    for row in rows:
        if row["outcome"] != "accepted":
            continue
        paths = [f"/v1/documents/{row['document_id']}", f"/v1/jobs/{row['job_id']}"]
        if row.get("ingest") == "ready":
            paths.append(f"/v1/documents/{row['document_id']}/pages")
        problems = [f"{path}: {p}" for path in paths
                    if (p := _get_problem(service, path)) is not None]
        gets += len(paths)
        if problems:
            row["read_back"] = problems
    listing = service.client.get(f"/v1/collections/{col}/documents")
    accepted = {r["document_id"] for r in rows if r["outcome"] == "accepted"}
    problem = reply_problem(listing) or (None if listing.status_code != 200 or accepted <= {
        d["document_id"] for d in listing.json()} else "the listing lacks accepted documents")
    return {"status": listing.status_code, "problem": problem, "gets": gets + 1}


def _get_problem(service: _Service, path: str) -> str | None:
    try:
        r = service.client.get(path)
    except httpx.TransportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return reply_problem(r) if r.status_code == 200 else f"status {r.status_code}"


def _figures(args: argparse.Namespace, service: _Service, rows: list[dict[str, Any]],
             stuck: int, listing: dict[str, Any], seconds: float) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for r in rows:
        key = str(r.get("status", r["outcome"]))
        statuses[key] = statuses.get(key, 0) + 1
    accepted = [r for r in rows if r["outcome"] == "accepted"]
    crashes = sum(r["outcome"] == "crash" or r.get("ingest") == "crash" for r in rows)
    return {
        "command": f"python -m lab.fuzz.uploads --http --count {args.count} --seed {args.seed} "
                   f"--devset-files {args.devset_files}"
                   + (f" --json {args.json}" if args.json else ""),
        "mode": "http",
        "server": {k: v for k, v in service.env.items() if k.startswith("CONDUIT_")},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "git_commit": _git_commit(),
        "sources": sorted({r["source"] for r in rows}),
        "files_tried": len(rows),
        "upload_statuses": dict(sorted(statuses.items())),
        "accepted": len(accepted),
        "ingest_ready": sum(r.get("ingest") == "ready" for r in accepted),
        "ingest_failed": sum(r.get("ingest") == "failed" for r in accepted),
        "pages": sum(int(r.get("pages", 0)) for r in accepted),
        "pages_skipped": sum(int(r.get("skipped", 0)) for r in accepted),
        "server_errors": sum(int(r.get("status", 0)) >= 500 for r in rows),
        "bad_replies": sum(r["outcome"] in ("bad_reply", "transport") for r in rows),
        "api_process_crashes": crashes,
        "stuck_jobs": stuck,
        "poll_errors": sum(r.get("ingest") == "poll_error" for r in rows),
        "read_back_gets": listing["gets"],
        "read_back_problems": sum(len(r.get("read_back", [])) for r in rows)
        + (listing["problem"] is not None),
        "listing_status": listing["status"],
        "listing_problem": listing["problem"],
        "api_start_rss_mib": round(min(service.baselines) / 1024, 1),
        "api_peak_after_first_ingest_mib": round(next(
            (r["api_hwm_kib"] for r in accepted if "api_hwm_kib" in r), 0) / 1024, 1),
        "api_peak_rss_mib": round(max(service.peaks, default=0) / 1024, 1),
        "crash_logs": service.crash_logs,
        "slowest_upload_s": max((r["upload_s"] for r in rows), default=0.0),
        "wall_s": round(seconds, 1),
        "rows": rows,
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False, cwd=Path(__file__).parent)
    except OSError:
        return ""
    return out.stdout.strip()


def passed(figures: dict[str, Any]) -> bool:
    """Whether the HTTP run met every check."""
    return (figures["api_process_crashes"] == figures["stuck_jobs"] == 0
            and figures["server_errors"] == figures["bad_replies"] == 0
            and figures["poll_errors"] == figures["read_back_problems"] == 0
            and figures["listing_status"] == 200)
