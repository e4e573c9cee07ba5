"""Ingest time of a scanned document with its OCR in 1 vs N worker processes, side by side.

    python -m lab.retrieval.devsets.hard_devset --out /tmp/hardset
    python -m lab.ingest.ocr_workers \
        --pdf /tmp/hardset/pdfs/lumen_retail_group_annual_return_0977041.pdf \
        --workers 1,2 --json lab/ingest/results/ocr_workers.json

Runs `iter_pages` (render at the service's default dpi and pixel cap, text, OCR) over the
document once per setting, alternating settings for `--rounds` rounds, checks that every
setting read the same text, and writes the median seconds and the speed-up over 1 worker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from worker.ingest import iter_pages, open_pdf
from worker.settings import Settings


def read(path: Path, workers: int, settings: Settings) -> tuple[float, list[str]]:
    """Seconds to read every page of `path`, and the pages' texts."""
    started = time.perf_counter()
    data = path.read_bytes()
    with open_pdf(data, max_pages=settings.worker.max_pages):
        pass  # the same check the service makes before reading pages
    texts = [p.text.text for p in iter_pages(data, dpi=settings.worker.render_dpi,
                                             max_pixels=settings.worker.max_page_pixels,
                                             ocr=True, ocr_workers=workers)]
    return time.perf_counter() - started, texts


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pdf", type=Path, required=True)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    settings = Settings()
    counts = [int(w) for w in args.workers.split(",")]
    seconds: dict[int, list[float]] = {w: [] for w in counts}
    reference: list[str] | None = None
    for _ in range(args.rounds):
        for workers in counts:
            took, texts = read(args.pdf, workers, settings)
            if reference is None:
                reference = texts
            if texts != reference:
                raise SystemExit(f"{workers} workers read different text")
            seconds[workers].append(took)
            print(f"ocr_workers={workers}: {took:.1f} s", flush=True)
    base = statistics.median(seconds[counts[0]])
    result = {
        "pdf": args.pdf.name, "pages": len(reference or []), "cpus": os.cpu_count(),
        "machine": platform.machine(), "render_dpi": settings.worker.render_dpi,
        "median_s": {str(w): round(statistics.median(s), 2) for w, s in seconds.items()},
        "speedup_vs_first": {str(w): round(base / statistics.median(s), 2)
                             for w, s in seconds.items()},
        "runs_s": {str(w): [round(x, 2) for x in s] for w, s in seconds.items()},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["speedup_vs_first"]))


if __name__ == "__main__":
    main()
