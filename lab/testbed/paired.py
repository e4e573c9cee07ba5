"""`conduit-lab testbed paired`: one policy against full prefill and against the other
policies of the same records, per checkpoint and pooled, with paired bootstrap intervals.

Reads per-question records as `testbed probe --records` and `eval answers` write them (one
file per checkpoint, the same questions in each). Every statistic compares rows on the same
questions (`lab.testbed.intervals`). The pooled column puts the checkpoints' questions
together (each checkpoint's id prefixed by its run), so its interval is that of the mean over
checkpoints of equal size: the quantity a default is chosen by.

Public API:
  POOLED = "pooled"
  paired_table(runs, policy, budget) -> str     markdown; runs: {run name: Scores}
"""

from __future__ import annotations

from collections.abc import Mapping

from lab.testbed.intervals import Interval, Scores, family_of, mean_interval, paired_interval

POOLED = "pooled"
FULL = ("full_prefill", 1.0)


def _pooled(runs: Mapping[str, Scores]) -> Scores:
    """The runs' records as one, question ids prefixed by their run."""
    out: Scores = {}
    for name, scores in runs.items():
        for key, by_id in scores.items():
            out.setdefault(key, {}).update({f"{name}/{i}": s for i, s in by_id.items()})
    return out


def _cell(value: float, interval: Interval) -> str:
    return f"{value:.3f} [{interval.lo:.3f}, {interval.hi:.3f}]"


def _mean(a: Mapping[str, float], ids: list[str]) -> float:
    return sum(a[i] for i in ids) / len(ids)


def _column(scores: Scores, policy: str, budget: float) -> dict[str, str]:
    """Row label -> cell of one run."""
    mine, full = scores[(policy, budget)], scores[FULL]
    ids = sorted(set(mine) & set(full))
    if not ids:
        raise ValueError(f"no question answered by both {policy} at {budget:g} and full prefill")
    cells = {"questions": str(len(ids)),
             "full prefill": _cell(_mean(full, ids), mean_interval(full, ids)),
             f"{policy} at {budget:g}": _cell(_mean(mine, ids), mean_interval(mine, ids))}
    families = sorted({family_of(i) for i in ids})
    for fam in ["all", *families]:
        sub = ids if fam == "all" else [i for i in ids if family_of(i) == fam]
        base = _mean(full, sub)
        cells[f"ratio to full prefill, {fam}"] = "-" if base == 0 else _cell(
            _mean(mine, sub) / base, paired_interval(mine, full, sub, "ratio"))
    for other, b in sorted(k for k in scores if k[1] == budget and k[0] != policy):
        theirs = scores[(other, b)]
        both = [i for i in ids if i in theirs]
        for fam in ["all", *families]:
            sub = both if fam == "all" else [i for i in both if family_of(i) == fam]
            cells[f"minus {other}, {fam}"] = _cell(_mean(mine, sub) - _mean(theirs, sub),
                                                   paired_interval(mine, theirs, sub, "diff"))
    return cells


def paired_table(runs: Mapping[str, Scores], policy: str, budget: float) -> str:
    """Markdown: a column per run and the pooled one, a row per statistic (accuracy of full
    prefill and of `policy` at `budget`, its ratio to full prefill and its lead over every
    other policy at `budget`, overall and per family), each value with its 95% interval."""
    if not runs:
        raise ValueError("no runs")
    columns = {name: _column(scores, policy, budget) for name, scores in runs.items()}
    if len(runs) > 1:
        columns[POOLED] = _column(_pooled(runs), policy, budget)
    labels = list(dict.fromkeys(label for col in columns.values() for label in col))
    lines = ["| statistic | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    lines += [f"| {label} | " + " | ".join(col.get(label, "-") for col in columns.values())
              + " |" for label in labels]
    return "\n".join(lines)
