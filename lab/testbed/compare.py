"""Probe rows as tables: one checkpoint's policies side by side, and several checkpoints'
mean and spread.

Probe rows (`lab.testbed.probe.probe`, or the `rows` of a `lab.testbed.variants` file) hold
per (family, policy, budget) the question count, the accuracy, how often the asked key cells
were refreshed and the mean LM FLOPs ratio.

    python -m lab.testbed.compare RUN_A.json [RUN_B.json ...] [--out FILE.md]

Public API:
  overall(rows) -> dict[(policy, budget), dict]     accuracy and FLOPs over every family
  table(rows) -> str                                markdown: one row per policy x budget
  across(runs) -> str                               markdown: mean, min and max over runs
  frontier(rows, path, fixed="conduit", prefix="cv_mass_")   PNG: accuracy against FLOPs
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Cell = tuple[str, float]


def _cells(rows: list[Row]) -> dict[Cell, dict[str, Row]]:
    by: dict[Cell, dict[str, Row]] = defaultdict(dict)
    for r in rows:
        by[(str(r["policy"]), float(r["budget"]))][str(r["family"])] = r
    return by


def overall(rows: list[Row]) -> dict[Cell, dict[str, float]]:
    """Per (policy, budget): accuracy and LM FLOPs ratio over every family (weighted by
    question count), and each family's accuracy."""
    out: dict[Cell, dict[str, float]] = {}
    for cell, fams in _cells(rows).items():
        n = sum(int(r["n"]) for r in fams.values())
        acc = sum(float(r["accuracy"]) * int(r["n"]) for r in fams.values()) / n
        flops = sum(float(r.get("flops_ratio_lm") or 0.0) * int(r["n"])
                    for r in fams.values()) / n
        out[cell] = {"all": acc, "flops_ratio_lm": flops, "n": n,
                     **{f: float(r["accuracy"]) for f, r in fams.items()}}
    return out


def _families(rows: list[Row]) -> list[str]:
    return sorted({str(r["family"]) for r in rows})


def table(rows: list[Row]) -> str:
    """Markdown: policy x budget rows, accuracy per family and overall, LM FLOPs ratio."""
    fams = _families(rows)
    lines = ["| policy | budget | " + " | ".join(fams) + " | all | LM FLOPs |",
             "|---|---:|" + "---:|" * (len(fams) + 2)]
    for (policy, budget), o in sorted(overall(rows).items()):
        lines.append(f"| {policy} | {budget:g} | "
                     + " | ".join(f"{o.get(f, float('nan')):.3f}" for f in fams)
                     + f" | **{o['all']:.3f}** | {o['flops_ratio_lm']:.3f} |")
    return "\n".join(lines)


def across(runs: dict[str, list[Row]]) -> str:
    """Markdown: per policy x budget, overall accuracy mean (min-max) over `runs` (name ->
    rows), then each run's value."""
    per = {name: overall(rows) for name, rows in runs.items()}
    cells = sorted(set().union(*(set(o) for o in per.values())))
    names = list(runs)
    lines = ["| policy | budget | mean | min-max | " + " | ".join(names) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(names)]
    for cell in cells:
        vals = [per[n][cell]["all"] for n in names if cell in per[n]]
        lines.append(f"| {cell[0]} | {cell[1]:g} | **{statistics.fmean(vals):.3f}** | "
                     f"{min(vals):.3f}-{max(vals):.3f} | "
                     + " | ".join(f"{per[n][cell]['all']:.3f}" if cell in per[n] else "-"
                                  for n in names) + " |")
    return "\n".join(lines)


def frontier(rows: list[Row], path: Path, fixed: str = "conduit",
             prefix: str = "cv_mass_") -> None:
    """Plot overall accuracy against mean LM FLOPs ratio: `fixed` at each budget (a line)
    and every policy named `prefix`* at each of its caps (points), to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o = overall(rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    line = sorted((v["flops_ratio_lm"], v["all"]) for (p, _), v in o.items() if p == fixed)
    ax.plot([x for x, _ in line], [y for _, y in line], "o-", label=f"{fixed} (fixed budgets)")
    for (p, b), v in sorted(o.items()):
        if p.startswith(prefix):
            ax.scatter(v["flops_ratio_lm"], v["all"], marker="^")
            ax.annotate(f"{p.removeprefix('cv_')} @{b:g}", (v["flops_ratio_lm"], v["all"]),
                        fontsize=7)
    for p, style in (("full_prefill", "k--"), ("full_reuse", "r:")):
        ref = [v["all"] for (q, _), v in o.items() if q == p]
        if ref:
            ax.axhline(ref[0], color=style[0], linestyle=style[1:], label=p, linewidth=1)
    ax.set_xlabel("LM FLOPs / full prefill")
    ax.set_ylabel("exact match")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    """Print (and with --out write) the tables of one or more probe files."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--frontier", type=Path, default=None,
                    help="PNG: accuracy against LM FLOPs, fixed budgets and budgets per "
                    "question (the first run)")
    args = ap.parse_args()
    runs = {p.stem: json.loads(p.read_text())["rows"] for p in args.runs}
    text = "\n\n".join(f"### {name}\n\n{table(rows)}" for name, rows in runs.items())
    if len(runs) > 1:
        text += "\n\n### across runs\n\n" + across(runs)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.frontier:
        frontier(next(iter(runs.values())), args.frontier)


if __name__ == "__main__":
    main()
