"""Outputs of the TTFT benchmark (`lab.ttft.bench`): JSON, markdown table, sweep plot, summary.

Public API:
  write_outputs(doc, out) -> None      JSON at `out`; markdown at out.md; PNG at out.png when
                                       the document has a page sweep
  target_checks(doc) -> list[(name, value, target, passed)]   the issue's targets
  summary_lines(doc) -> list[str]      what the command line prints
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TARGETS = {"speedup": 8.0, "bound_fraction": 0.60, "flops_ratio_lm": 0.15, "disk_load": 0.20}


def _row(doc: dict[str, Any], method: str, tier: str) -> dict[str, Any] | None:
    return next((r for r in doc["rows"] if r["method"] == method and r["tier"] == tier), None)


def target_checks(doc: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """CONDUIT's speedup, bound fraction and FLOPs ratio per tier; disk load share."""
    out = []
    for tier in doc["workload"]["tiers"]:
        r = _row(doc, "conduit", tier)
        if r is None:
            continue
        out.append((f"conduit speedup ({tier})", r["speedup"], f">= {TARGETS['speedup']}",
                    r["speedup"] >= TARGETS["speedup"]))
        out.append((f"conduit speedup / bound ({tier})", r["bound_fraction"],
                    f">= {TARGETS['bound_fraction']}",
                    r["bound_fraction"] >= TARGETS["bound_fraction"]))
        if tier == "disk":
            out.append(("disk load / conduit TTFT", r["load_fraction"],
                        f"<= {TARGETS['disk_load']}", r["load_fraction"] <= TARGETS["disk_load"]))
    r = next((r for r in doc["rows"] if r["method"] == "conduit"), None)
    if r is not None:
        out.append(("conduit FLOPs ratio (language model)", r["flops_ratio_lm"],
                    f"<= {TARGETS['flops_ratio_lm']}",
                    r["flops_ratio_lm"] <= TARGETS["flops_ratio_lm"]))
    return out


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _main_table(doc: dict[str, Any]) -> list[str]:
    lines = ["| method | tier | TTFT ms (median) | min-max | speedup | speedup of fastest "
             "runs | speedup vs cached vision | FLOPs LM | FLOPs total | speedup / bound "
             "(total) | speedup / bound (LM) | load ms | load / TTFT |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(
            f"| {r['method']} | {r['tier']} | {r['ttft_ms_median']:.1f} | "
            f"{r['ttft_ms_min']:.0f}-{r['ttft_ms_max']:.0f} | {r['speedup']:.2f}x | "
            f"{r['speedup_of_min']:.2f}x | {_opt(r['speedup_vs_cached_vision'], '.2f')}x | "
            f"{r['flops_ratio_lm']:.3f} | {r['flops_ratio_total']:.3f} | "
            f"{r['bound_fraction']:.2f} | {_opt(r['bound_fraction_lm'], '.2f')} | "
            f"{r['load_ms_median']:.1f} | {r['load_fraction']:.3f} |")
    return lines


def _sweep_growth(doc: dict[str, Any]) -> list[str]:
    """Per-page TTFT and FLOPs of CONDUIT relative to the smallest sweep point."""
    pts = sorted((r for r in doc["sweep"] if r["method"] == "conduit"), key=lambda r: r["pages"])
    full = {r["pages"]: r for r in doc["sweep"] if r["method"] == "full_prefill"}
    if not pts:
        return []
    p0 = pts[0]
    base_t = p0["ttft_ms_median"] / p0["pages"]
    base_f = p0["gflops_used"] / p0["pages"]
    lines = ["| pages | conduit TTFT ms | per page, x first | conduit GFLOPs | per page, "
             "x first | full prefill TTFT ms | speedup | FLOPs LM | FLOPs total | conduit "
             "peak MB | scoring pass peak MB | full peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in pts:
        f = full.get(r["pages"], {})
        lines.append(
            f"| {r['pages']} | {r['ttft_ms_median']:.1f} | "
            f"{r['ttft_ms_median'] / r['pages'] / base_t:.2f} | {r['gflops_used']:.4g} | "
            f"{r['gflops_used'] / r['pages'] / base_f:.2f} | "
            f"{f.get('ttft_ms_median', float('nan')):.1f} | {r['speedup']:.2f}x | "
            f"{r['flops_ratio_lm']:.3f} | {r['flops_ratio_total']:.3f} | "
            f"{r['peak_mb'] or 0:.1f} | {r.get('scoring_peak_mb') or 0:.1f} | "
            f"{f.get('peak_mb') or 0:.1f} |")
    return lines


def _notes(doc: dict[str, Any]) -> list[str]:
    """What the rows say beyond themselves: the vision tower's share of full prefill time vs
    its share of FLOPs, and CacheBlend's uncredited work."""
    full = _row(doc, "full_prefill", "none")
    tier = doc["workload"]["tiers"][0]
    cached = _row(doc, "full_prefill_cached_vision", tier)
    out = []
    if full and cached:
        t_share = 1 - cached["ttft_ms_median"] / full["ttft_ms_median"]
        f_share = 1 - cached["flops_ratio_total"]
        out.append(
            f"- The vision tower is {f_share:.0%} of full prefill's FLOPs and {t_share:.0%} of "
            f"its time here (full prefill vs cached vision features, {tier} tier): where it runs "
            "at a lower FLOP rate than the language model, a method that skips it can exceed "
            "1.0 speedup / bound (total). The LM columns leave the vision tower out on both "
            "sides: speedup over `full_prefill_cached_vision` against the language-model "
            "FLOPs ratio.")
    out.append("- CacheBlend resumes its carried tokens from the check layer (its check pass "
               "already ran them through layers 0..check): its time and FLOPs describe the "
               "same work.")
    out.append("- Medians over rounds on a shared machine; `speedup of fastest runs` compares "
               "the minima, the runs least disturbed by other processes.")
    return out


def _table(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    lm = w["lm_shape"]
    out = [f"# TTFT: reuse methods vs full prefill ({w['model_shape']}, {w['device']}, "
           f"{w['dtype']})", "", f"Command: `{w['command']}`", "",
           f"Model: random-weight Qwen2.5-VL ({w['model_notes']}): LM {lm['layers']} layers, "
           f"hidden {lm['hidden']}, {lm['heads']}/{lm['kv_heads']} heads, d_ff "
           f"{lm['intermediate']}; vision tower {w['vision']}.",
           f"Request: {w['pages']} pages x {w['tokens_per_page']} visual tokens "
           f"({w['visual_tokens']} segment tokens with delimiters), {w['text_tokens']} text "
           f"tokens ({w['question_tokens']}-token question), {w['prompt_tokens']} in all; pages "
           "prefilled in their canonical page context, reused under a new system prefix with "
           "a label before each page.",
           f"Budgets: {w['budgets']}. Machine: {w['machine']}, {w['threads']} thread(s); "
           f"{w['warmup']} warm-up round(s), {w['repeats']} timed rounds, methods alternating "
           "in a rotated order. TTFT = tier load + assembly + policy + refresh + first token; "
           "speedup = full prefill median / method median (same run); FLOPs LM = analytic "
           "language-model FLOPs used / a full prefill's (the headline); FLOPs total = the same "
           "with the vision tower counted (full prefill runs it, reuse does not).",
           "Tiers: " + "; ".join(f"{k}: {v}" for k, v in w["tier_notes"].items()) + ".",
           "Bytes per page loaded: " + ", ".join(
               f"{k} {v:,}" for k, v in w.get("tier_bytes_per_page", {}).items())
           + "; the load's share of TTFT is each row's load / TTFT.", ""]
    if w.get("check"):
        c = w["check"]
        out += [f"Correctness first: CONDUIT at budget 1.0 vs full prefill, first-token logits "
                f"max |diff| / max |logit| = {c['budget_one_rel_diff']:.2e} (tolerance "
                f"{c['tolerance']}), top-1 equal: {c['top1_equal']}.", ""]
    out += _main_table(doc)
    out += ["", "Notes:", ""] + _notes(doc)
    out += ["", "Targets:", ""]
    out += [f"- {name}: {value:.3f} (target {target}) {'PASS' if ok else 'MISS'}"
            for name, value, target, ok in target_checks(doc)]
    if doc.get("sweep"):
        out += ["", "## Page sweep (refresh path: CONDUIT at 10%)", ""] + _sweep_growth(doc)
    return "\n".join(out) + "\n"


def _plot(doc: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for method, style in (("full_prefill", "s--"), ("conduit", "o-")):
        pts = sorted((r for r in doc["sweep"] if r["method"] == method), key=lambda r: r["pages"])
        xs = [r["pages"] for r in pts]
        axes[0].plot(xs, [r["ttft_ms_median"] for r in pts], style, label=method)
        axes[1].plot(xs, [r["peak_mb"] or 0 for r in pts], style, label=method)
        if method == "conduit" and pts:
            t0 = pts[0]["ttft_ms_median"] / pts[0]["pages"]
            f0 = pts[0]["gflops_used"] / pts[0]["pages"]
            axes[2].plot(xs, [r["ttft_ms_median"] / r["pages"] / t0 for r in pts], "o-",
                         label="TTFT per page")
            axes[2].plot(xs, [r["gflops_used"] / r["pages"] / f0 for r in pts], "^:",
                         label="FLOPs per page (analytic)")
    w = doc["workload"]
    for ax, title, ylabel in ((axes[0], "TTFT vs pages", "ms (median)"),
                              (axes[1], "peak memory of the request", "MB above start"),
                              (axes[2], "CONDUIT cost per page, x smallest", "ratio")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"pages ({w['tokens_per_page']} visual tokens each)")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_yscale("log")
    fig.suptitle(f"TTFT sweep, {w['model_shape']} model, {w['device']} {w['dtype']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(doc: dict[str, Any], out: Path) -> None:
    """Write the JSON document, its markdown table and (with a sweep) the PNG plot."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(_table(doc))
    if doc.get("sweep"):
        _plot(doc, out.with_suffix(".png"))


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """Median TTFT, speedup, FLOPs ratio and bound fraction of every row, then targets."""
    lines = [f"{'method':28s} {'tier':7s} {'TTFT ms':>9s} {'speedup':>8s} {'vs cv':>7s} "
             f"{'FLOPs LM':>8s} {'total':>7s} {'sp/bound':>8s} {'load ms':>8s}"]
    for r in doc["rows"]:
        lines.append(f"{r['method']:28s} {r['tier']:7s} {r['ttft_ms_median']:9.1f} "
                     f"{r['speedup']:7.2f}x {_opt(r['speedup_vs_cached_vision'], '6.2f')}x "
                     f"{r['flops_ratio_lm']:8.3f} {r['flops_ratio_total']:7.3f} "
                     f"{r['bound_fraction']:8.2f} {r['load_ms_median']:8.1f}")
    lines += [f"{name}: {value:.3f} (target {target}) {'PASS' if ok else 'MISS'}"
              for name, value, target, ok in target_checks(doc)]
    return lines
