"""Markdown table and PNG plot of a fidelity evaluation document (`lab.fidelity.evaluate`).

Public API:
  write_table(doc, path) -> None     markdown: command, setup, one row per policy and budget
  write_plot(doc, path) -> None      PNG: KL gap closed, top-1, continuation vs budget; and
                                     KL gap closed vs FLOPs ratio
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_RANDOM_WEIGHTS_NOTE = (
    "**What a random-weight model can and cannot show.** `builtin:` models are tiny "
    "({layers} decoder layers, hidden {hidden}, at most {max_image_tokens} visual tokens per "
    "page here) with random weights: "
    "their attention carries no answer-relevant signal, so these numbers check the machinery "
    "(budget 1.0 and `full_prefill` reproduce full prefill; quality rises with budget; the "
    "FLOPs accounting) and measure how far stale page KV drifts from a full prefill under a "
    "new prefix. They say nothing about which policy finds the *relevant* tokens of a real "
    "document; that needs a trained checkpoint (`--model` a local Qwen2-VL folder). The "
    "FLOPs ratio of a tiny model is dominated by its text tokens and vision tower, unlike a "
    "7B model with ~1,000 visual tokens per page, and CPU wall times of a model this small "
    "are per-layer overhead, not compute. CacheBlend runs every token through layers 0..1 "
    "(its default check layer is 1) before it selects, so on a {layers}-layer model it pays "
    "a large share of a full prefill; its FLOPs column shows that cost."
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
        " FLOPs LM = language-model prefill FLOPs / a full prefill's (the headline); FLOPs "
        "total = the same with the vision tower counted (a full prefill runs it, reuse does "
        "not); TTFT = the answer's time to first token; refreshed = visual tokens "
        "recomputed (mean, of `visual`).",
        "",
        "| policy | budget | top-1 | KL | gap closed | cont. | FLOPs LM | FLOPs total | TTFT ms "
        "| refreshed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in _ordered(doc):
        g = gap[(r["policy"], r["budget"])]
        lines.append(
            f"| {r['policy']} | {r['budget']:.2f} | {r['top1_agreement']:.3f} | "
            f"{r['kl']:.2e} | {'' if g is None else f'{g:.2f}'} | "
            f"{r['continuation_match']:.3f} | {r['flops_ratio_lm']:.3f} | "
            f"{r['flops_ratio_total']:.3f} | "
            f"{r['seconds'] * 1000:.1f} | {r['refreshed']:.1f} / {r['visual']:.0f} |")
    if doc["model"].startswith("builtin:"):
        lines += ["", _RANDOM_WEIGHTS_NOTE.format(layers=doc["lm_shape"]["layers"],
                                                  hidden=doc["lm_shape"]["hidden"],
                                                  max_image_tokens=doc["max_image_tokens"])]
    lines.append("")
    path.write_text("\n".join(lines))


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """Write quality vs budget, one line per policy, and quality vs FLOPs, to `path` (PNG).

    Quality is the KL gap closed (1 - KL / KL(full_reuse)) when full_reuse was run, else KL."""
    gap = _gap_closed(doc)
    has_gap = any(v is not None for v in gap.values())
    quality = (("gap", "KL gap closed: 1 - KL / KL(full_reuse)") if has_gap
               else ("kl", "KL(full || policy), first token"))
    metrics = [quality, ("top1_agreement", "top-1 agreement"),
               ("continuation_match", "continuation match")]
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(20, 4.8))
    rows = _ordered(doc)
    colors = plt.get_cmap("tab20")

    def value(r: dict[str, Any], key: str) -> float:
        if key == "gap":
            g = gap[(r["policy"], r["budget"])]
            return float("nan") if g is None else g
        return float(r[key])

    for i, name in enumerate(doc["policies"]):
        mine = [r for r in rows if r["policy"] == name]
        flat = name in ("full_prefill", "full_reuse", "prefix_reuse")
        style = {"linestyle": "--" if flat else "-", "marker": "s" if flat else "o",
                 "color": colors(i % 20), "markersize": 4, "label": name,
                 "linewidth": 2.5 if name == "conduit" else 1.2}
        for ax, (key, _) in zip(axes, metrics, strict=False):
            ax.plot([r["budget"] for r in mine], [value(r, key) for r in mine], **style)
        axes[-1].plot([r["flops_ratio_lm"] for r in mine], [value(r, quality[0]) for r in mine],
                      **style)
    for ax, (key, title) in zip(axes, metrics, strict=False):
        ax.set_xlabel("budget (fraction of visual tokens)")
        ax.set_title(title)
        if key == "kl":
            ax.set_yscale("symlog", linthresh=1e-6)
    axes[-1].set_xlabel("language-model FLOPs / full prefill's")
    axes[-1].set_title(f"{quality[1].split(':')[0]} vs FLOPs")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{doc['model']}: {doc['samples']} requests x {doc['pages']} pages")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
