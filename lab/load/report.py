"""The load bench's rows (JSON lines) as markdown tables and a plot.

The first table has a row per run (form, engine, model, answer cap, uploads, clients,
throughput, TTFT and latency percentiles, /healthz p99, errors, peak RSS with the reader
children, and whether the service's processes stayed within their bound: `lab.load.bench`);
the second, "batched vs serial", gives for each (form, model, answer cap, uploads, clients)
run with both engines the ratios batched / serial of throughput and of median TTFT (the last
row of each engine counts when `rows` repeat a run). The plot has a pair of panels per form,
median TTFT (log scale) and throughput against clients, a line per engine and uploads setting.

Public API:
  write_report(rows_path, stem) -> (markdown path, PNG path)   `stem`.md and `stem`.png
  markdown(rows) -> str;  ratios(rows) -> list[dict];  plot(rows, path)
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


def _uploads(r: dict[str, Any]) -> str:
    every = r.get("upload_every")
    return "-" if every is None else ("none" if every == 0 else f"1 in {every}")


def _model(r: dict[str, Any]) -> str:
    if "model" not in r:
        return "-"
    return "service default" if r["model"] is None else str(r["model"])


def _within(r: dict[str, Any]) -> str:
    within, bound = r.get("rss_within_bound"), r.get("rss_bound_mb")
    if not within or not bound:
        return "-"
    own = r.get("peak_process_rss_mb", {})
    return ", ".join(f"{role} {'yes' if ok else 'NO'} ({own.get(role, 0):.0f} of "
                     f"{bound[role]:.0f})" for role, ok in within.items())


def _healthz(r: dict[str, Any]) -> str:
    """/healthz p99 from the prober process, and from the thread among the clients (runs
    before the prober process existed have only the thread's, as `healthz_latency_s`)."""
    in_load = r.get("healthz_in_load_latency_s")
    if in_load is None:
        return f"- / {_fmt(r['healthz_latency_s']['p99'])}"
    return f"{_fmt(r['healthz_latency_s']['p99'])} / {_fmt(in_load['p99'])}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of runs, a row each, then the "batched vs serial" table (if any run has
    both engines)."""
    out = ["| form | engine | model | max tokens | uploads | clients | answers+uploads/s | "
           "tokens/answer | TTFT p50 s | TTFT p95 s | answer p50 s | /healthz p99 s (probe "
           "process / thread among clients) | errors | peak RSS MB | RSS within bound (peak "
           "of bound MB) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rss = ", ".join(f"{k} {v:.0f}" for k, v in r["peak_rss_mb"].items())
        errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "none"
        out.append(
            f"| {r['form']} | {r.get('engine', 'serial (before issue 29)')} | {_model(r)} | "
            f"{r.get('max_new_tokens', '-')} | {_uploads(r)} | "
            f"{r['clients']} | {r['throughput_rps']:.3f} | "
            f"{_fmt(r.get('tokens_per_answer'), 1)} | {_fmt(r['ttft_s']['p50'])} | "
            f"{_fmt(r['ttft_s']['p95'])} | {_fmt(r['query_latency_s']['p50'])} | "
            f"{_healthz(r)} | {errors} | {rss} | {_within(r)} |")
    table = ratios(rows)
    if table:
        out += ["", "Batched vs serial (ratio batched / serial; throughput above 1 and TTFT "
                "below 1 favour batched):", "",
                "| form | model | max tokens | uploads | clients | throughput ratio | "
                "output tokens/s ratio | TTFT p50 ratio |", "|---|---|---|---|---|---|---|---|"]
        out += [f"| {t['form']} | {t['model']} | {t['max_new_tokens']} | {t['uploads']} | "
                f"{t['clients']} | {_fmt(t['throughput_ratio'], 2)} | "
                f"{_fmt(t['tokens_ratio'], 2)} | "
                f"{_fmt(t['ttft_p50_ratio'], 2)} |" for t in table]
    return "\n".join(out) + "\n"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (form, model, max tokens, uploads, clients) with a serial and a batched row:
    throughput, output tokens/s and median TTFT of batched divided by serial's (None where
    either is missing or serial's is zero), in the rows' order."""
    last: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("engine") in ("serial", "batched"):
            key = (r["form"], _model(r), r.get("max_new_tokens", "-"), _uploads(r),
                   r["clients"])
            last.setdefault(key, {})[r["engine"]] = r
    out = []
    for (form, model, cap, uploads, clients), pair in last.items():
        if len(pair) < 2:
            continue
        s, b = pair["serial"], pair["batched"]
        out.append({"form": form, "model": model, "max_new_tokens": cap, "uploads": uploads,
                    "clients": clients,
                    "throughput_ratio": _ratio(b["throughput_rps"], s["throughput_rps"]),
                    "tokens_ratio": _ratio(b.get("output_tokens_per_s"),
                                           s.get("output_tokens_per_s")),
                    "ttft_p50_ratio": _ratio(b["ttft_s"]["p50"], s["ttft_s"]["p50"])})
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median TTFT (log scale) and throughput against clients: a pair of panels per form, a
    line per engine and uploads setting."""
    forms = list(dict.fromkeys(r["form"] for r in rows)) or ["-"]
    fig, axes = plt.subplots(len(forms), 2, figsize=(10, 3.6 * len(forms)), squeeze=False)
    colours: dict[str, str] = {}
    for (ax_t, ax_r), form in zip(axes, forms, strict=True):
        series: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["form"] == form:
                label = f"{r.get('engine', '?')}, uploads {_uploads(r)}"
                series.setdefault(label, []).append(r)
        for label, group in series.items():
            group = sorted(group, key=lambda r: r["clients"])
            xs = [r["clients"] for r in group]
            ttft = [r["ttft_s"]["p50"] for r in group]
            # colour: the engine; dashed with squares: uploads mixed in
            mixed = bool(group[0].get("upload_every"))
            style = {"color": colours.setdefault(group[0].get("engine", "?"),
                                                 f"C{len(colours)}"),
                     "linestyle": "--" if mixed else "-", "marker": "s" if mixed else "o",
                     "label": label}
            ax_t.plot(xs, [float("nan") if t is None else t for t in ttft], **style)
            ax_r.plot(xs, [r["throughput_rps"] for r in group], **style)
        ax_t.set(xscale="log", yscale="log", xlabel="clients", ylabel="median TTFT (s)",
                 title=form)
        ax_r.set(xscale="log", xlabel="clients", ylabel="answers + uploads per second",
                 title=form)
        if series:
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
