"""Fuzz the upload path with mutated real PDFs (issue 30): no crash, no stuck job, bounded memory.

    python -m lab.fuzz.uploads --count 60 --json lab/fuzz/results/fuzz_uploads.json

Sources and mutants come from `mutants.py` (the dev set's smallest PDFs under `--devset`
and the lab's PDF builders). Each mutant (byte flips anywhere or in the file's structure,
a truncation, a splice of two files, a zeroed, deleted or repeated range) goes through
what an upload goes through: `check_upload` (the open in a confined reader process) and,
when accepted, every page read by the readers (`iter_pages`, OCR off) under a document
deadline.

A driver process (`--driver`) plays the API process: it runs the mutants one after another
and prints one JSON line per mutant with its outcome and its own peak RSS (VmHWM). The
supervisor (this command) counts a driver that dies as a crash of the API process and a
mutant with no answer within `--stuck-after` seconds as a stuck job (it then kills the
driver's process group), and restarts the driver at the next mutant either way.
`--http` sends the same mutants through a real embedded service instead (`uploads_http.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lab import LAB
from lab.fuzz.mutants import DEVSET, fuzz_sources, hwm_kib, mutants, mutate


def _peak_rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class _ReaderPeak:
    """The highest VmHWM seen among this process's reader processes, sampled every 50 ms
    by a thread. (`RUSAGE_CHILDREN` cannot tell: a child started with vfork inherits its
    parent's peak.) A reader's last moments can fall between two samples."""

    def __init__(self) -> None:
        self.kib = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        me = os.getpid()
        while True:
            for task in Path(f"/proc/{me}/task").glob("*/children"):
                try:
                    pids = task.read_text().split()
                except OSError:
                    continue
                for pid in pids:
                    self.kib = max(self.kib, _reader_hwm(pid))
            time.sleep(0.05)


def _reader_hwm(pid: str) -> int:
    """VmHWM of reader `pid` in KiB (0: not a reader yet, or gone)."""
    try:  # a child not yet exec'd still shares this process's memory
        if b"reader_child" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return 0
    except OSError:
        return 0
    return hwm_kib(pid)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def drive(args: argparse.Namespace) -> int:
    """The driver ("API process"): run mutants `start` .. `count`, one JSON line each."""
    from worker.ingest import Deadline, IngestError, ReaderLimits, iter_pages
    from worker.uploads import check_upload

    sources = dict(fuzz_sources(args))
    names = sorted(sources)
    limits = ReaderLimits(memory_mb=args.memory_mb, page_seconds=args.page_seconds)
    readers = _ReaderPeak()
    print(json.dumps({"ready": True, "rss_kib": _peak_rss_kib()}), flush=True)
    for index, (name, label, seed) in enumerate(mutants(args.seed, args.count,
                                                        list(sources.items()))):
        if index < args.start:
            continue
        if index == args.abort_at:  # the supervisor's own test: a crash of the API process
            os.abort()
        if index == args.hang_at:  # and a stuck job
            time.sleep(3600)
        rng = random.Random(seed)
        kind, data = mutate(rng, sources[name], sources[rng.choice(names)])
        row: dict[str, Any] = {"i": index, "source": name, "mutation": kind, "seed": label,
                               "bytes": len(data)}
        started = time.monotonic()
        try:
            checked = check_upload(data, password=None, max_bytes=64 * 2**20,
                                   max_pages=500, limits=limits)
        except IngestError as exc:
            row.update(outcome="refused", status=exc.http_status, error=type(exc).__name__,
                       message=exc.message)
        except Exception as exc:  # noqa: BLE001 - a 500 in the service: counted
            row.update(outcome="unexpected", error=f"{type(exc).__name__}: {exc}"[:300])
        else:
            row.update(outcome="accepted", pages=checked.page_count)
            row.update(_ingest(checked.data, limits, args, iter_pages, Deadline, IngestError))
        row.update(seconds=round(time.monotonic() - started, 2), rss_kib=_peak_rss_kib(),
                   readers_rss_kib=readers.kib)
        print(json.dumps(row), flush=True)
    return 0


def _ingest(data: bytes, limits: Any, args: argparse.Namespace, iter_pages: Any,
            deadline_cls: Any, ingest_error: Any) -> dict[str, Any]:
    read = skipped = 0
    reasons: list[str] = []
    try:
        for page in iter_pages(data, dpi=40, max_pixels=10**6, ocr=False, ocr_workers=1,
                               limits=limits, max_pages=500,
                               deadline=deadline_cls(args.deadline)):
            if page.error is None:
                read += 1
            else:
                skipped += 1
                reasons.append(page.error)
    except ingest_error as exc:
        return {"ingest": "failed", "error": type(exc).__name__, "message": exc.message,
                "read": read, "skipped": skipped}
    except Exception as exc:  # noqa: BLE001 - an ingest crash: counted
        return {"ingest": "unexpected", "error": f"{type(exc).__name__}: {exc}"[:300]}
    utf8 = all(_utf8(r) for r in reasons)
    if not read:  # what `check_readable` makes of it: UnreadableDocumentError
        return {"ingest": "failed", "error": "UnreadableDocumentError", "read": 0,
                "skipped": skipped, "reasons_utf8": utf8}
    return {"ingest": "ready", "read": read, "skipped": skipped, "reasons_utf8": utf8}


def fuzz(args: argparse.Namespace) -> dict[str, Any]:
    """Supervise drivers over the whole plan; return the figures."""
    rows: list[dict[str, Any]] = []
    crashes = stuck = 0
    baseline: list[int] = []
    started = time.monotonic()
    start = 0
    while start < args.count:
        next_start, how = _supervise(args, start, rows, baseline)
        if how == "crash":
            crashes += 1
        elif how == "stuck":
            stuck += 1
        start = next_start
    return _figures(args, rows, crashes, stuck, baseline, time.monotonic() - started)


def _supervise(args: argparse.Namespace, start: int, rows: list[dict[str, Any]],
               baseline: list[int]) -> tuple[int, str]:
    """Run one driver from mutant `start`; return (where to go on, "done"/"crash"/"stuck").
    The mutant a driver died or stuck on gets a row of its own."""
    argv = [sys.executable, "-m", "lab.fuzz.uploads", "--driver", "--start", str(start)]
    argv += _passed_args(args)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True,
                            cwd=LAB.parent)
    assert proc.stdout is not None
    expected, buffer, ready = start, b"", False
    last = time.monotonic()
    while True:
        limit = args.stuck_after if ready else args.stuck_after + 300  # imports first
        if select.select([proc.stdout], [], [], 1.0)[0]:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                status = proc.wait()
                if not ready:
                    raise RuntimeError(f"the driver did not start (status {status})")
                if expected >= args.count and status == 0:
                    return expected, "done"
                rows.append({"i": expected, "outcome": "crash", "status": status})
                return expected + 1, "crash"
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                row = json.loads(line)
                last = time.monotonic()
                if row.get("ready"):
                    ready = True
                    baseline.append(int(row["rss_kib"]))
                    continue
                rows.append(row)
                expected = int(row["i"]) + 1
        elif time.monotonic() - last > limit:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rows.append({"i": expected, "outcome": "stuck"})
            return expected + 1, "stuck"


def _passed_args(args: argparse.Namespace) -> list[str]:
    return ["--count", str(args.count), "--seed", str(args.seed), "--devset", str(args.devset),
            "--devset-files", str(args.devset_files), "--memory-mb", str(args.memory_mb),
            "--page-seconds", str(args.page_seconds), "--deadline", str(args.deadline),
            "--abort-at", str(args.abort_at), "--hang-at", str(args.hang_at)]


def _figures(args: argparse.Namespace, rows: list[dict[str, Any]], crashes: int, stuck: int,
             baseline: list[int], seconds: float) -> dict[str, Any]:
    done = [r for r in rows if r.get("outcome") not in ("stuck", "crash")]
    refused: dict[str, int] = {}
    for r in done:
        if r["outcome"] == "refused":
            key = f"{r['status']} {r['error']}"
            refused[key] = refused.get(key, 0) + 1
    accepted = [r for r in done if r["outcome"] == "accepted"]
    messages = [r.get("message", "") for r in done]
    return {
        "command": f"python -m lab.fuzz.uploads --count {args.count} --seed {args.seed} "
                   f"--devset-files {args.devset_files}"
                   + (f" --json {args.json}" if args.json else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "sources": sorted({r.get("source", "") for r in done if r.get("source")}),
        "files_tried": len(rows),
        "accepted": len(accepted),
        "refused": dict(sorted(refused.items())),
        "ingest_ready": sum(r.get("ingest") == "ready" for r in accepted),
        "ingest_failed": sum(r.get("ingest") == "failed" for r in accepted),
        "pages_read": sum(int(r.get("read", 0)) for r in accepted),
        "pages_skipped": sum(int(r.get("skipped", 0)) for r in accepted),
        "unexpected_errors": sum(r["outcome"] == "unexpected" or r.get("ingest") == "unexpected"
                                 for r in done),
        "api_process_crashes": crashes,
        "stuck_jobs": stuck,
        "messages_not_utf8": sum(not _utf8(m) for m in messages)
        + sum(r.get("reasons_utf8") is False for r in accepted),
        "api_baseline_rss_mib": round(min(baseline) / 1024, 1) if baseline else None,
        "api_peak_rss_mib": round(max((r.get("rss_kib", 0) for r in done), default=0) / 1024, 1),
        "reader_peak_rss_mib": round(max((r.get("readers_rss_kib", 0) for r in done),
                                         default=0) / 1024, 1),
        "slowest_file_s": max((r.get("seconds", 0.0) for r in done), default=0.0),
        "wall_s": round(seconds, 1),
        "rows": rows,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=60, help="mutants to try")
    p.add_argument("--seed", type=int, default=30)
    p.add_argument("--devset", default=str(DEVSET), help="folder of real PDFs (read in place)")
    p.add_argument("--devset-files", type=int, default=6, help="smallest dev-set PDFs used")
    p.add_argument("--memory-mb", type=int, default=1024, help="reader address-space limit")
    p.add_argument("--page-seconds", type=float, default=60.0, help="reader time limit")
    p.add_argument("--deadline", type=float, default=120.0, help="per-document deadline (s)")
    p.add_argument("--stuck-after", type=float, default=300.0,
                   help="seconds without an answer after which a mutant counts as stuck")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--http", action="store_true",
                   help="upload through a real embedded `conduit serve` (uploads_http.py)")
    p.add_argument("--keep-home", action="store_true", help="--http: keep the service's home")
    p.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--abort-at", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--hang-at", type=int, default=-1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the fuzz (or, with `--driver`, one driver); print the figures."""
    args = parse(argv)
    if args.driver:
        return drive(args)
    from lab.fuzz.uploads_http import fuzz_http, passed
    figures = fuzz_http(args) if args.http else fuzz(args)
    summary = {k: v for k, v in figures.items() if k != "rows"}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    if args.http:
        return 0 if passed(figures) else 1
    return 0 if figures["api_process_crashes"] == figures["stuck_jobs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
