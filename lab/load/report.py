"""The load bench's rows (JSON lines) as a markdown table and a plot of median TTFT and
throughput against clients, one line per (form, engine).

Public API:
  write_report(rows_path, stem) -> (markdown path, PNG path)   `stem`.md and `stem`.png
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table row per run: form, engine, clients, throughput, TTFT and latency
    percentiles, /healthz p99, errors, peak RSS."""
    out = ["| form | engine | uploads | clients | answers+uploads/s | TTFT p50 s | TTFT p95 s | "
           "answer p50 s | /healthz p99 s | errors | peak RSS MB |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        every = r.get("upload_every")
        uploads = "-" if every is None else ("none" if every == 0 else f"1 in {every}")
        rss = ", ".join(f"{k} {v:.0f}" for k, v in r["peak_rss_mb"].items())
        errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "none"
        out.append(
            f"| {r['form']} | {r.get('engine', 'serial (before issue 29)')} | {uploads} | "
            f"{r['clients']} | {r['throughput_rps']:.3f} | {_fmt(r['ttft_s']['p50'])} | "
            f"{_fmt(r['ttft_s']['p95'])} | {_fmt(r['query_latency_s']['p50'])} | "
            f"{_fmt(r['healthz_latency_s']['p99'])} | {errors} | {rss} |")
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median TTFT (log scale) and throughput against clients, a line per form and engine."""
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(10, 4))
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(f"{r['form']}, {r.get('engine', '?')}", []).append(r)
    for label, group in series.items():
        group = sorted(group, key=lambda r: r["clients"])
        xs = [r["clients"] for r in group]
        ax_t.plot(xs, [r["ttft_s"]["p50"] for r in group], marker="o", label=label)
        ax_r.plot(xs, [r["throughput_rps"] for r in group], marker="o", label=label)
    ax_t.set(xscale="log", yscale="log", xlabel="clients", ylabel="median TTFT (s)")
    ax_r.set(xscale="log", xlabel="clients", ylabel="answers + uploads per second")
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(rows_path: Path, stem: Path) -> tuple[Path, Path]:
    """Write `stem`.md and `stem`.png from the rows in `rows_path`."""
    rows = _rows(rows_path)
    md, png = stem.with_suffix(".md"), stem.with_suffix(".png")
    stem.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(f"Rows of `{rows_path.name}`; command: `{rows[0]['command']}`\n\n"
                  + markdown(rows) if rows else "no rows\n")
    plot(rows, png)
    return md, png
