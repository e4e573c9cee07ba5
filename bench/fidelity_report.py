"""Markdown table and PNG plot of a fidelity evaluation document (`bench.fidelity`).

Public API:
  write_table(doc, path) -> None     markdown: command, setup, one row per policy and budget
  write_plot(doc, path) -> None      PNG: KL, top-1 agreement and continuation match vs budget
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_RANDOM_WEIGHTS_NOTE = (
    "**What a random-weight model can and cannot show.** `builtin:` models are tiny "
    "(2 decoder layers, hidden 64, at most 16 visual tokens per page) with random weights: "
    "their attention carries no answer-relevant signal, so these numbers check the machinery "
    "(budget 1.0 and `full_prefill` reproduce full prefill; quality rises with budget; the "
    "FLOPs accounting) and measure how far stale page KV drifts from a full prefill under a "
    "new prefix. They say nothing about which policy finds the *relevant* tokens of a real "
    "document; that needs a trained checkpoint (`--model` a local Qwen2-VL folder). The "
    "FLOPs ratio of a tiny model is dominated by its text tokens and vision tower, unlike a "
    "7B model with ~1,000 visual tokens per page. With 2 layers CacheBlend's default check "
    "layer (1) recomputes every layer for every token, i.e. it is a full prefill here."
)


def _ordered(doc: dict[str, Any]) -> list[dict[str, Any]]:
    order = {p: i for i, p in enumerate(doc["policies"])}
    return sorted(doc["rows"], key=lambda r: (order.get(r["policy"], 99), r["budget"]))


def _gap_closed(doc: dict[str, Any]) -> dict[tuple[str, float], float | None]:
    """1 - KL(policy) / KL(full_reuse) at the same budget (None without full_reuse)."""
    reuse = {r["budget"]: r["kl"] for r in doc["rows"] if r["policy"] == "full_reuse"}
    out: dict[tuple[str, float], float | None] = {}
    for r in doc["rows"]:
        base = reuse.get(r["budget"])
        out[(r["policy"], r["budget"])] = (1.0 - r["kl"] / base) if base else None
    return out


def write_table(doc: dict[str, Any], path: Path) -> None:
    """Write the markdown report of `doc` to `path`."""
    gap = _gap_closed(doc)
    lines = [
        f"# Fidelity vs full prefill: `{doc['model']}`",
        "",
        "Produced by:",
        "",
        "```",
        doc["command"],
        "```",
        "",
        f"{doc['samples']} requests x {doc['pages']} pages (seed {doc['seed']}); pages "
        "prefilled once in the canonical page context, reused under a new system prefix with "
        "a label before each page. Reference: full prefill from the images. "
        f"Greedy continuation over {doc['max_new_tokens']} tokens. {doc['machine']}; "
        f"full prefill TTFT {doc['full_prefill_seconds'] * 1000:.1f} ms; "
        f"run took {doc['wall_seconds']:.0f} s.",
        "",
        "Columns: top-1 = first token equal to full prefill's (fraction); KL = "
        "KL(full || policy) of the first-token distribution (nats); gap closed = 1 - KL / "
        "KL(full_reuse); cont. = greedy continuation match (common prefix / reference length);"
        " FLOPs = reported FLOPs / full prefill FLOPs (vision tower included; reuse does not "
        "pay it); TTFT = the answer's time to first token; refreshed = visual tokens "
        "recomputed (mean, of `visual`).",
        "",
        "| policy | budget | top-1 | KL | gap closed | cont. | FLOPs | TTFT ms | refreshed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in _ordered(doc):
        g = gap[(r["policy"], r["budget"])]
        lines.append(
            f"| {r['policy']} | {r['budget']:.2f} | {r['top1_agreement']:.3f} | "
            f"{r['kl']:.2e} | {'' if g is None else f'{g:.2f}'} | "
            f"{r['continuation_match']:.3f} | {r['flops_ratio']:.3f} | "
            f"{r['seconds'] * 1000:.1f} | {r['refreshed']:.1f} / {r['visual']:.0f} |")
    lines += ["", _RANDOM_WEIGHTS_NOTE if doc["model"].startswith("builtin:") else "", ""]
    path.write_text("\n".join(lines))


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """Write quality vs budget, one line per policy, to `path` (PNG)."""
    metrics = [("kl", "KL(full || policy), first token", True),
               ("top1_agreement", "top-1 agreement", False),
               ("continuation_match", "continuation match", False)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(15, 4.6))
    rows = _ordered(doc)
    for ax, (key, title, log) in zip(axes, metrics, strict=True):
        for name in doc["policies"]:
            pts = [(r["budget"], r[key]) for r in rows if r["policy"] == name]
            style = "--" if name in ("full_prefill", "full_reuse", "prefix_reuse") else "-o"
            ax.plot([p[0] for p in pts], [max(p[1], 1e-12) if log else p[1] for p in pts],
                    style, label=name, markersize=4)
        ax.set_xlabel("budget (fraction of visual tokens)")
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{doc['model']}: {doc['samples']} requests x {doc['pages']} pages")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
