"""Cost of reading pages in sandboxed reader processes, and what content bombs do to them.

    python -m lab.ingest.page_readers --json lab/ingest/results/page_readers.json

Measures, side by side in one run: the start of one reader (forked by the fork server, the
default, and started as a new process); a 20-page text PDF read in this
process (the path before the sandbox: render + text layer) vs by 1 and 2 readers; and three
generated content bombs (one huge string, blanks, line segments) under given limits: the
outcome, the seconds to it, and this process's peak RSS growth (it must stay flat).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

import pymupdf

from worker.ingest import IngestError, ReaderLimits, iter_pages
from worker.ingest.render import render_page
from worker.ingest.sandbox import PageReader
from worker.ingest.text import page_text

PAGES = 20
DPI, MAX_PIXELS = 100, 1654 * 2339  # the service's defaults
BOMBS = [("string", 128, ReaderLimits(memory_mb=400, page_seconds=300)),
         ("spaces", 128, ReaderLimits(memory_mb=2048, page_seconds=300)),
         ("paths", 4, ReaderLimits(memory_mb=2048, page_seconds=300))]


def _text_pdf() -> bytes:
    doc = pymupdf.open()
    for n in range(PAGES):
        page = doc.new_page(width=595, height=842)
        page.insert_textbox(pymupdf.Rect(50, 60, 545, 780),
                            f"Page {n + 1}. " + "The harbour ledger lists ferries. " * 60,
                            fontsize=10)
    data = bytes(doc.tobytes(garbage=3, deflate=True))
    doc.close()
    return data


def _in_process(data: bytes) -> float:
    started = time.perf_counter()
    with pymupdf.open("pdf", data) as doc:
        for i in range(doc.page_count):
            render_page(doc, i, dpi=DPI, max_pixels=MAX_PIXELS)
            page_text(doc.load_page(i), ocr=False)
    return time.perf_counter() - started


def _readers(data: bytes, workers: int) -> float:
    started = time.perf_counter()
    for _ in iter_pages(data, dpi=DPI, max_pixels=MAX_PIXELS, ocr=False, ocr_workers=workers):
        pass
    return time.perf_counter() - started


def _start(data: bytes, fork_server: bool) -> float:
    started = time.perf_counter()
    PageReader(data, password=None, limits=ReaderLimits(), fork_server=fork_server).close()
    return time.perf_counter() - started


def _bomb(kind: str, mib: int, limits: ReaderLimits) -> dict[str, object]:
    from lab.ingest.bad_pdfs import content_bomb_pdf

    data = content_bomb_pdf(mib, kind=kind)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    try:
        for _ in iter_pages(data, dpi=DPI, max_pixels=MAX_PIXELS, ocr=False, limits=limits):
            pass
        outcome = "read"
    except IngestError as exc:
        outcome = exc.message
    return {"kind": kind, "content_mib": mib, "file_bytes": len(data),
            "memory_mb": limits.memory_mb, "page_seconds": limits.page_seconds,
            "outcome": outcome, "seconds": round(time.perf_counter() - started, 2),
            "parent_peak_rss_growth_mib":
                round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, 1)}


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    data = _text_pdf()
    seconds: dict[str, list[float]] = {"in_process": [], "readers_1": [], "readers_2": [],
                                       "reader_start_forked": [], "reader_start_spawned": []}
    _start(data, fork_server=True)  # the fork server starts at the first reader: not timed
    for _ in range(args.rounds):  # alternate settings so load changes hit all of them
        seconds["reader_start_forked"].append(_start(data, fork_server=True))
        seconds["reader_start_spawned"].append(_start(data, fork_server=False))
        seconds["in_process"].append(_in_process(data))
        seconds["readers_1"].append(_readers(data, 1))
        seconds["readers_2"].append(_readers(data, 2))
        print({k: round(v[-1], 2) for k, v in seconds.items()}, flush=True)
    median = {k: round(statistics.median(v), 3) for k, v in seconds.items()}
    bombs = [_bomb(*b) for b in BOMBS]
    for bomb in bombs:
        print(bomb, flush=True)
    result = {"pages": PAGES, "dpi": DPI, "cpus": os.cpu_count(), "rounds": args.rounds,
              "load_average": os.getloadavg(), "python": platform.python_version(),
              "median_seconds": median, "all_seconds": seconds,
              "reader_start_spawned_over_forked": round(
                  median["reader_start_spawned"] / median["reader_start_forked"], 1),
              "readers_1_over_in_process": round(median["readers_1"] / median["in_process"], 2),
              "readers_2_over_in_process": round(median["readers_2"] / median["in_process"], 2),
              "bombs": bombs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
