"""Answer evaluations of one question set on independently trained checkpoints, side by side:
each policy's mean and spread over the checkpoints, and the policy the mean ranks first.

Issue 28 asks that every conclusion hold on at least three checkpoints trained from the same
recipe with different seeds, and that the default be chosen by the mean. Each input is an
`eval answers` document (`runner.run_answer_eval`) of the same questions; the combined
document has, per (group, policy, budget) present in every run, the mean, min and max over
the runs of each metric in `METRICS`, and each run's value.

    conduit-lab eval across final_s0.json final_s1.json final_s2.json --out across.json

writes across.json, across.md and across.png.

Public API:
  METRICS                                  the row fields combined
  combine(docs, names, command) -> dict    {"meta", "rows", "choice"}; ValueError when the
                                           runs did not answer the same questions
  choose(rows, budget) -> dict             the policy with the best mean accuracy at `budget`
                                           (ties: lower mean LM FLOPs), and the runner-up
  at_equal_flops(rows, policy, fixed) -> list   a budget per question against fixed budgets
  discordant(records, a, b, budget) -> dict   questions one policy answers and the other not
  write_markdown(doc, path); write_plot(doc, path)
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from lab.answers.results import BUDGET_FREE, CACHED_REFERENCE, REFERENCE

METRICS = ("accuracy", "accuracy_ratio_to_full", "agreement_with_full", "flops_ratio_lm",
           "ttft_speedup_vs_full", "ttft_speedup_vs_cached")
SAME_SET = ("questions_answered", "pages_mode", "pages_per_question_mean",
            "visual_tokens_per_question_mean", "max_new_tokens")  # meta that must agree
Row = dict[str, Any]


def _check_same_set(docs: Sequence[dict[str, Any]], names: Sequence[str]) -> None:
    for key in SAME_SET:
        values = {name: doc["meta"].get(key) for name, doc in zip(names, docs, strict=True)}
        if len(set(map(json.dumps, values.values()))) > 1:
            raise ValueError(f"the runs did not answer the same questions: {key} differs "
                             f"({values})")


def _spread(values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"mean": None, "min": None, "max": None}
    return {"mean": statistics.fmean(present), "min": min(present), "max": max(present)}


def combine(docs: Sequence[dict[str, Any]], names: Sequence[str], command: str = "") -> dict:
    """Mean, min, max and per-run values of every metric per (group, policy, budget) that
    every run has; the choice at budget 0.1 (or the budget nearest it)."""
    if len(docs) != len(names) or not docs:
        raise ValueError("give one name per run, and at least one run")
    _check_same_set(docs, names)
    cells = [{(r["group"], r["policy"], float(r["budget"])): r for r in d["rows"]} for d in docs]
    common = [k for k in cells[0] if all(k in c for c in cells[1:])]
    rows: list[Row] = []
    for group, policy, budget in common:
        runs = [c[(group, policy, budget)] for c in cells]
        row: Row = {"group": group, "policy": policy, "budget": budget,
                    "n": [int(r["n"]) for r in runs]}
        for m in METRICS:
            values = [r.get(m) for r in runs]
            row[m] = {**_spread(values), "runs": values}
        rows.append(row)
    budgets = sorted({b for _, p, b in common if p not in (REFERENCE, CACHED_REFERENCE)})
    near = min(budgets, key=lambda b: abs(b - 0.1)) if budgets else 1.0
    meta = {"command": command, "runs": list(names),
            "run_commands": [d["meta"].get("command") for d in docs],
            "models": [d["meta"].get("model") for d in docs],
            **{k: docs[0]["meta"].get(k) for k in SAME_SET}, "budgets": budgets}
    return {"meta": meta, "rows": rows, "choice": choose(rows, near)}


def choose(rows: Sequence[Row], budget: float) -> dict[str, Any]:
    """The policy with the best mean accuracy over group `all` at `budget`, ties broken by
    the lower mean LM FLOPs ratio, among those that spend the budget (the references and the
    budget-free `full_reuse` and `prefix_reuse`, which recomputes every row after the
    prompt head, are excluded); with the runner-up and how many runs each is first in."""
    cands = [r for r in rows if r["group"] == "all" and r["budget"] == budget
             and r["policy"] not in {REFERENCE, CACHED_REFERENCE, *BUDGET_FREE}]
    if not cands:
        return {"budget": budget, "policy": None, "runner_up": None}
    ranked = sorted(cands, key=lambda r: (-r["accuracy"]["mean"],
                                          r["flops_ratio_lm"]["mean"] or 0.0))
    n_runs = len(ranked[0]["accuracy"]["runs"])
    wins = [sum(1 for i in range(n_runs)
                if r["accuracy"]["runs"][i] == max(c["accuracy"]["runs"][i] for c in cands))
            for r in ranked]
    return {"budget": budget, "policy": ranked[0]["policy"],
            "runner_up": ranked[1]["policy"] if len(ranked) > 1 else None,
            "mean_accuracy": ranked[0]["accuracy"]["mean"],
            "runner_up_mean_accuracy": ranked[1]["accuracy"]["mean"] if len(ranked) > 1 else None,
            "first_in_runs": {r["policy"]: w for r, w in zip(ranked, wins, strict=True)}}


def at_equal_flops(rows: Sequence[Row], policy: str, fixed: str) -> list[dict[str, Any]]:
    """`policy` (a budget per question, e.g. `conduit_adaptive`) against `fixed` at its fixed
    budgets, group `all`, per run: for each budget (cap) of `policy`, its accuracy minus that
    of the cheapest fixed budget spending at least its mean LM FLOPs (`vs_cheapest_above`;
    its FLOPs as a share of that budget's: `flops_share_of_cheapest_above`), and minus the
    fixed rule's accuracy interpolated at its FLOPs on the line through full reuse and the
    fixed budgets (`vs_interpolated`; accuracy rises concavely with FLOPs, so the line lies
    below the fixed rule's real curve and flatters `policy`). Nothing when either policy is
    missing."""
    cells = {(r["policy"], r["budget"]): r for r in rows if r["group"] == "all"}
    fixed_rows = sorted((b, r) for (p, b), r in cells.items() if p == fixed)
    anchor = next((r for (p, _), r in cells.items() if p == "full_reuse"), None)
    out: list[dict[str, Any]] = []
    for (p, budget), mine in sorted(cells.items()):
        if p != policy or not fixed_rows:
            continue
        above: list[float | None] = []
        share: list[float | None] = []
        interp: list[float | None] = []
        for i, flops in enumerate(mine["flops_ratio_lm"]["runs"]):
            acc = mine["accuracy"]["runs"][i]
            pts = sorted((r["flops_ratio_lm"]["runs"][i], r["accuracy"]["runs"][i])
                         for _, r in fixed_rows)
            if anchor is not None:
                pts = sorted([(anchor["flops_ratio_lm"]["runs"][i],
                               anchor["accuracy"]["runs"][i]), *pts])
            costlier = [(f, a) for f, a in pts if f >= flops]
            above.append(acc - costlier[0][1] if costlier else None)
            share.append(flops / costlier[0][0] if costlier and costlier[0][0] else None)
            interp.append(acc - _interpolate(pts, flops))
        out.append({"budget": budget, "flops_ratio_lm": mine["flops_ratio_lm"],
                    "accuracy": mine["accuracy"], "fixed": fixed,
                    "vs_cheapest_above": {**_spread(above), "runs": above},
                    "flops_share_of_cheapest_above": {**_spread(share), "runs": share},
                    "vs_interpolated": {**_spread(interp), "runs": interp}})
    return out


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear y at `x` through `points` (sorted by x), held flat beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return points[-1][1]


def discordant(records: Sequence[dict[str, Any]], a: str, b: str, budget: float) -> dict:
    """Over the questions both `a` and `b` answered at `budget` in one run's records: how
    many `a` scored higher on (`a_only`) and how many `b` did (`b_only`)."""
    score = {(r["id"], r["policy"]): float(r["score"]) for r in records
             if "score" in r and abs(float(r.get("budget", -1)) - budget) < 1e-9}
    ids = {q for q, p in score if p == a} & {q for q, p in score if p == b}
    return {"n": len(ids), "a_only": sum(score[(q, a)] > score[(q, b)] for q in ids),
            "b_only": sum(score[(q, b)] > score[(q, a)] for q in ids)}


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _cell(stat: dict[str, Any], digits: int = 3) -> str:
    if stat["mean"] is None:
        return "-"
    return (f"{_fmt(stat['mean'], digits)} ({_fmt(stat['min'], digits)}-"
            f"{_fmt(stat['max'], digits)})")


def write_markdown(doc: dict[str, Any], path: Path, default_policy: str | None = None) -> None:
    """Write the combined table of `doc` to `path`: group `all` per policy x budget, accuracy
    per task family at the choice budget, the choice (and `default_policy`, the service's)."""
    meta, rows, choice = doc["meta"], doc["rows"], doc["choice"]
    names = meta["runs"]
    lines = [f"# Answer accuracy over {len(names)} checkpoints: mean (min-max)", "",
             "Produced by:", "", "```", meta["command"] or "(Python API)", "```", "",
             "Runs (each an `eval answers` document of the same questions):", ""]
    lines += [f"- `{n}`: `{c}`" for n, c in zip(names, meta["run_commands"], strict=True)]
    lines += ["", f"{meta['questions_answered']} questions per run, {meta['pages_mode']} pages, "
              f"{_fmt(meta['pages_per_question_mean'], 2)} pages and "
              f"{_fmt(meta['visual_tokens_per_question_mean'], 0)} visual tokens per question.",
              "", "| policy | budget | accuracy | ratio to full | LM FLOPs | TTFT speed-up vs "
              "full | vs cached | " + " | ".join(f"acc. {n}" for n in names) + " |",
              "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(names)]
    for r in (r for r in rows if r["group"] == "all"):
        lines.append(f"| {r['policy']} | {r['budget']:.2f} | {_cell(r['accuracy'])} | "
                     f"{_cell(r['accuracy_ratio_to_full'])} | {_cell(r['flops_ratio_lm'])} | "
                     f"{_cell(r['ttft_speedup_vs_full'], 2)} | "
                     f"{_cell(r['ttft_speedup_vs_cached'], 2)} | "
                     + " | ".join(_fmt(v) for v in r["accuracy"]["runs"]) + " |")
    lines += _family_lines(rows, choice["budget"])
    if choice["policy"]:
        wins = ", ".join(f"`{p}` {w}" for p, w in choice["first_in_runs"].items() if w)
        lines += ["", f"**Best mean accuracy at {choice['budget']:g}: `{choice['policy']}`** "
                  f"({_fmt(choice['mean_accuracy'])}; runner-up `{choice['runner_up']}` "
                  f"{_fmt(choice['runner_up_mean_accuracy'])}). First (ties included) in how "
                  f"many runs: {wins}."]
        for d in choice.get("discordant", []):
            lines.append(f"- `{d['run']}`: of {d['n']} questions, `{choice['policy']}` alone "
                         f"right on {d['a_only']}, `{choice['runner_up']}` alone on "
                         f"{d['b_only']}.")
    for fixed in dict.fromkeys(["conduit", choice["policy"] or "conduit"]):
        lines += _equal_flops_lines(at_equal_flops(rows, "conduit_adaptive", fixed))
    if default_policy:
        lines += ["", f"The service's default policy (`CONDUIT_POLICY`): `{default_policy}`."]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _family_lines(rows: Sequence[Row], budget: float) -> list[str]:
    groups = list(dict.fromkeys(r["group"] for r in rows if r["group"].startswith("family=")))
    if not groups:
        return []
    cell = {(r["group"], r["policy"], r["budget"]): r for r in rows}
    policies = list(dict.fromkeys(r["policy"] for r in rows if r["group"] == "all"))
    lines = ["", f"Mean accuracy (min-max) by task family (references at 1.0, policies at "
             f"{budget:g}):", "", "| policy | " + " | ".join(
                 g.removeprefix("family=") for g in groups) + " |",
             "|---|" + "---:|" * len(groups)]
    for p in policies:
        b = 1.0 if p in (REFERENCE, CACHED_REFERENCE) else budget
        if (groups[0], p, b) in cell:
            lines.append(f"| {p} | " + " | ".join(
                _cell(cell[(g, p, b)]["accuracy"]) if (g, p, b) in cell else "-"
                for g in groups) + " |")
    return lines


def _equal_flops_lines(found: list[dict[str, Any]]) -> list[str]:
    if not found:
        return []
    fixed = found[0]["fixed"]
    lines = ["", f"A budget per question (`conduit_adaptive`) against `{fixed}` at fixed budgets "
             "(group all; differences in accuracy, mean (min-max) over the runs; 'cheapest "
             "above': the cheapest fixed budget spending at least as many LM FLOPs; "
             "'interpolated': on the line through full reuse and the fixed budgets, which "
             "flatters the budget per question):", "",
             "| cap | LM FLOPs | accuracy | vs cheapest above | its FLOPs / that budget's | "
             "vs interpolated |", "|---:|---:|---:|---:|---:|---:|"]
    for f in found:
        lines.append(f"| {f['budget']:.2f} | {_cell(f['flops_ratio_lm'])} | "
                     f"{_cell(f['accuracy'])} | {_cell(f['vs_cheapest_above'])} | "
                     f"{_cell(f['flops_share_of_cheapest_above'], 2)} | "
                     f"{_cell(f['vs_interpolated'])} |")
    return lines


def write_plot(doc: dict[str, Any], path: Path) -> None:
    """Mean accuracy (group `all`) per policy at each budget with min-max bars (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r["group"] == "all"]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    budgets = sorted({r["budget"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(policies)), 4))
    width = 0.8 / max(1, len(budgets))
    for j, b in enumerate(budgets):
        xs, ys, lo, hi = [], [], [], []
        for i, p in enumerate(policies):
            r = next((r for r in rows if r["policy"] == p and r["budget"] == b), None)
            if r is None or r["accuracy"]["mean"] is None:
                continue
            a = r["accuracy"]
            xs.append(i + (j - (len(budgets) - 1) / 2) * width)
            ys.append(a["mean"])
            lo.append(a["mean"] - a["min"])
            hi.append(a["max"] - a["mean"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=f"budget {b:g}")
    ax.set_xticks(range(len(policies)), policies, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("accuracy: mean, min-max over checkpoints")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
