"""Paired bootstrap intervals for the criteria of `lab.testbed.criteria`.

An `eval answers` run writes its per-question records beside its table
(`X.records.jsonl` beside `X.json`); every policy answered the same questions, so a
criterion that compares two rows (a ratio to full prefill, a gap, a lead over a baseline) is
resampled by question: each of `N_BOOT` resamples draws the family's question ids with
replacement and recomputes the statistic on both rows at once. The interval is the 2.5th and
97.5th percentile (a 95% percentile interval). Question ids are the generator's
(`lab.testbed.generate`: `<document>-<family>-<record keys>`), so a record's family is read
from its id.

Public API:
  N_BOOT = 2000
  Scores = dict[(policy, budget), dict[question id, score]]
  read_scores(records_path) -> Scores
  family_of(question_id) -> str
  Interval(lo, hi)
  mean_interval(a, ids, seed=0) -> Interval
  paired_interval(a, b, ids, op, seed=0) -> Interval     op "ratio" (a / b) or "diff" (a - b)
  records_beside(table_path) -> Path
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_BOOT = 2000
Scores = dict[tuple[str, float], dict[str, float]]


@dataclass(frozen=True)
class Interval:
    """A 95% bootstrap interval."""

    lo: float
    hi: float


def records_beside(table: Path) -> Path:
    """The records file `eval answers` writes beside the table `table` (X.json)."""
    return table.with_suffix(".records.jsonl")


def read_scores(path: Path) -> Scores:
    """Every record's score by (policy, budget) and question id (the header line skipped)."""
    out: Scores = {}
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            if "id" not in row:
                continue
            key = (str(row["policy"]), float(row["budget"]))
            out.setdefault(key, {})[str(row["id"])] = float(row["score"])
    return out


def family_of(question_id: str) -> str:
    """The family in a generated question id (`t007-split-AB` -> `split`)."""
    parts = question_id.split("-")
    if len(parts) < 3:
        raise ValueError(f"not a generated question id: {question_id!r}")
    return parts[1]


def _resamples(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(N_BOOT, n))  # (B, n)


def _interval(values: np.ndarray) -> Interval:
    lo, hi = np.nanpercentile(values, [2.5, 97.5])
    return Interval(float(lo), float(hi))


def mean_interval(a: Mapping[str, float], ids: Sequence[str], seed: int = 0) -> Interval:
    """95% interval of the mean of `a` over `ids`."""
    x = np.array([a[i] for i in ids])  # (n,)
    return _interval(x[_resamples(len(ids), seed)].mean(axis=1))


def paired_interval(a: Mapping[str, float], b: Mapping[str, float], ids: Sequence[str],
                    op: str, seed: int = 0) -> Interval:
    """95% interval of mean(a) / mean(b) (`op` "ratio") or mean(a) - mean(b) ("diff") over
    `ids`, both means taken on the same resampled questions."""
    if op not in ("ratio", "diff"):
        raise ValueError(f"op must be 'ratio' or 'diff', got {op!r}")
    x = np.array([a[i] for i in ids])  # (n,)
    y = np.array([b[i] for i in ids])  # (n,)
    idx = _resamples(len(ids), seed)  # (B, n)
    mx, my = x[idx].mean(axis=1), y[idx].mean(axis=1)  # (B,)
    if op == "diff":
        return _interval(mx - my)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _interval(np.where(my > 0, mx / my, np.nan))
