"""Issue 28's criteria on `eval answers` tables of the page-scale testbed, one row per table.

Each table is an `eval answers` document of the final question set (with distractors). The
criteria, as the issue states them, with `slack` (the issue allows 2 points on each of the
other checkpoints) taken off every accuracy threshold (not off the FLOPs and TTFT ones):
  - full prefill >= 90% overall;
  - full reuse >= 15 points below full prefill on each cross-page family (reference, split,
    legend), and within 2 points of it on the within-page lookups. Pair questions need two
    shown pages, but each value is read on its own page, so stale page KV is not expected to
    lose them: the issue added that family beside the cross-page ones, and it is held to
    the policy criteria only;
  - the default policy at 10%: >= 97% of full prefill's accuracy overall and on every family,
    LM FLOPs ratio <= 0.20, TTFT >= 3x faster than full prefill, and above every baseline
    (random, raw attention, value norm, CacheBlend, EPIC) overall.

    conduit-lab testbed criteria final_s0.json final_s1.json answers_page_scale.json \
        [--policy conduit_per_page] [--slack 0.02] [--intervals] [--out criteria.md]

With the runs' per-question records (`scores`; `--intervals` reads each table's
`.records.jsonl` beside it), every accuracy criterion also gets a 95% paired bootstrap
interval over the questions (`lab.testbed.intervals`): how far the question sample leaves
a criterion undecided.

Public API:
  CROSS_PAGE, CONTROL, BASELINES
  Check(name, value, threshold, holds, interval=None)
  check(doc, policy, budget=0.1, slack=0.0, scores=None) -> list[Check]
  markdown(runs, policy, slack, budget=0.1, scores=None) -> str   one column per run, a
      criterion per row
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from lab.testbed.intervals import Interval, Scores, family_of, mean_interval, paired_interval

CROSS_PAGE = ("reference", "split", "legend")  # a page's KV must hold another page's content
CONTROL = "lookup"  # the within-page control family
BASELINES = ("random", "raw_attention", "value_norm", "cacheblend", "epic")
_REFERENCE, _REUSE = "full_prefill", "full_reuse"


@dataclass(frozen=True)
class Check:
    """One criterion on one table: the measured value, the threshold it is held to (slack
    applied) and whether it holds."""

    name: str
    value: float | None
    threshold: str
    holds: bool
    interval: Interval | None = None  # 95% paired bootstrap over the questions


def _cells(doc: Mapping[str, Any]) -> dict[tuple[str, str, float], dict[str, Any]]:
    return {(r["group"], r["policy"], float(r["budget"])): r for r in doc["rows"]}


def _acc(cells: dict, group: str, policy: str, budget: float) -> float | None:
    row = cells.get((group, policy, budget))
    return None if row is None else float(row["accuracy"])


def _at_least(name: str, value: float | None, bound: float, shown: str) -> Check:
    return Check(name, value, shown, value is not None and value >= bound - 1e-12)


class _Intervals:
    """Bootstrap intervals of one run's criteria from its per-question scores (none without
    them): each method returns None where a row it needs is missing."""

    def __init__(self, scores: Scores | None) -> None:
        self.scores = scores or {}
        self.ids: dict[str, list[str]] = {"all": sorted(self.scores.get((_REFERENCE, 1.0), {}))}
        for qid in self.ids["all"]:
            self.ids.setdefault(f"family={family_of(qid)}", []).append(qid)

    def mean(self, group: str, row: tuple[str, float]) -> Interval | None:
        a = self.scores.get(row)
        return None if a is None or group not in self.ids else mean_interval(a, self.ids[group])

    def paired(self, group: str, a: tuple[str, float], b: tuple[str, float] | None,
               op: str) -> Interval | None:
        x, y = self.scores.get(a), None if b is None else self.scores.get(b)
        if x is None or y is None or group not in self.ids:
            return None
        return paired_interval(x, y, self.ids[group], op)


def check(doc: Mapping[str, Any], policy: str, budget: float = 0.1,
          slack: float = 0.0, scores: Scores | None = None) -> list[Check]:
    """Every criterion of issue 28 on one `eval answers` document (with `scores`, its
    per-question records, each accuracy criterion's interval too); `KeyError` when it lacks
    the reference, full reuse or `policy` at `budget`."""
    iv = _Intervals(scores)
    cells = _cells(doc)
    families = [g.removeprefix("family=") for g, p, _ in cells
                if p == _REFERENCE and g.startswith("family=")]
    full = {g: _acc(cells, g, _REFERENCE, 1.0) for g in ["all", *(f"family={f}" for f in families)]}
    if full["all"] is None or (("all", policy, budget) not in cells):
        raise KeyError(f"the table lacks {_REFERENCE} or {policy} at {budget:g}")
    reuse_budget = next((b for g, p, b in sorted(cells) if p == _REUSE and g == "all"), None)
    ref_row, mine_row = (_REFERENCE, 1.0), (policy, budget)
    reuse_row = None if reuse_budget is None else (_REUSE, reuse_budget)
    out = [replace(_at_least("full prefill overall", full["all"], 0.90 - slack,
                             f">= {0.90 - slack:.2f}"), interval=iv.mean("all", ref_row))]
    for fam in families:
        reuse = None if reuse_budget is None else _acc(cells, f"family={fam}", _REUSE,
                                                       reuse_budget)
        ref = full[f"family={fam}"]
        gap = None if reuse is None or ref is None else ref - reuse
        interval = iv.paired(f"family={fam}", ref_row, reuse_row, "diff")
        if fam == CONTROL:
            out.append(Check(f"full reuse on {fam}: full prefill minus it", gap,
                             f"<= {0.02 + slack:.2f}",
                             gap is not None and gap <= 0.02 + slack + 1e-12, interval))
        elif fam in CROSS_PAGE:
            out.append(replace(_at_least(f"full reuse on {fam}: full prefill minus it", gap,
                                         0.15 - slack, f">= {0.15 - slack:.2f}"),
                               interval=interval))
    mine = cells[("all", policy, budget)]
    for group in ("all", *(f"family={f}" for f in families)):
        acc, ref = _acc(cells, group, policy, budget), full.get(group)
        ratio = None if acc is None or not ref else acc / ref
        out.append(replace(_at_least(f"{policy} at {budget:g}: ratio to full prefill, "
                                     f"{group.removeprefix('family=')}", ratio, 0.97 - slack,
                                     f">= {0.97 - slack:.2f}"),
                           interval=iv.paired(group, mine_row, ref_row, "ratio")))
    flops = float(mine["flops_ratio_lm"])
    out.append(Check(f"{policy} at {budget:g}: LM FLOPs ratio", flops, "<= 0.20",
                     flops <= 0.20 + 1e-12))
    speedup = mine.get("ttft_speedup_vs_full")
    out.append(_at_least(f"{policy} at {budget:g}: TTFT speed-up over full prefill",
                         None if speedup is None else float(speedup), 3.0, ">= 3"))
    for base in BASELINES:
        other = _acc(cells, "all", base, budget)
        lead = None if other is None else float(mine["accuracy"]) - other
        out.append(Check(f"{policy} at {budget:g} minus {base}, overall", lead,
                         f"> {-slack:.2f}" if slack else "> 0", lead is not None and lead > -slack,
                         iv.paired("all", mine_row, (base, budget), "diff")))
    return out


def markdown(runs: Mapping[str, Mapping[str, Any]], policy: str, slack: float = 0.0,
             budget: float = 0.1, scores: Mapping[str, Scores] | None = None) -> str:
    """One column per run (value, its interval where the run's scores are given, and a cross
    where the criterion fails), one row per criterion; the runs' thresholds are those of
    `check` with `slack`."""
    scores = scores or {}
    checks = {name: {c.name: c for c in check(doc, policy, budget, slack, scores.get(name))}
              for name, doc in runs.items()}
    criteria = {c.name: c.threshold for cs in checks.values() for c in cs.values()}
    lines = ["| criterion | threshold | " + " | ".join(runs) + " |",
             "|---|---|" + "---:|" * len(runs)]
    for crit, threshold in criteria.items():
        cells = []
        for name in runs:
            mine = checks[name].get(crit)
            value = "-" if mine is None or mine.value is None else f"{mine.value:.3f}"
            if mine is not None and mine.interval is not None:
                value += f" [{mine.interval.lo:.3f}, {mine.interval.hi:.3f}]"
            cells.append(value if mine is not None and mine.holds else f"**{value} (no)**")
        lines.append(f"| {crit} | {threshold} | " + " | ".join(cells) + " |")
    held = {name: sum(c.holds for c in cs.values()) for name, cs in checks.items()}
    lines.append("| **criteria held** | | " + " | ".join(
        f"{held[n]} of {len(checks[n])}" for n in runs) + " |")
    return "\n".join(lines)
