"""Paired bootstrap intervals (`lab.testbed.intervals`) and the criteria with them: from
per-question records written as `eval answers` writes them, beside a table made from the
same records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lab.cli import main
from lab.testbed.criteria import BASELINES, check
from lab.testbed.intervals import (
    family_of,
    mean_interval,
    paired_interval,
    read_scores,
    records_beside,
)

FAMILIES = ("reference", "split", "legend", "lookup", "pair")
# (policy, budget) -> chance of a right answer per family
RATES = {("full_prefill", 1.0): 0.95, ("full_reuse", 0.1): 0.3,
         ("conduit_per_page", 0.1): 0.93, **{(b, 0.1): 0.6 for b in BASELINES}}


def _write_run(table: Path, n_docs: int = 60) -> dict:
    """Records (header line first) and the table `eval answers` would make of them."""
    rng = random.Random(7)
    ids = [f"t{d:03d}-{fam}-AB" for d in range(n_docs) for fam in FAMILIES]
    records = [{"config": {}}]
    for (policy, budget), rate in RATES.items():
        for qid in ids:
            rate_here = 1.0 if family_of(qid) == "lookup" and policy == "full_reuse" else rate
            records.append({"id": qid, "policy": policy, "budget": budget,
                            "score": float(rng.random() < rate_here)})
    records_beside(table).write_text("\n".join(json.dumps(r) for r in records) + "\n")
    rows = []
    for (policy, budget) in RATES:
        for group in ("all", *(f"family={f}" for f in FAMILIES)):
            got = [r["score"] for r in records[1:] if (r["policy"], r["budget"]) ==
                   (policy, budget) and group in ("all", f"family={family_of(r['id'])}")]
            rows.append({"group": group, "policy": policy, "budget": budget,
                         "accuracy": sum(got) / len(got), "flops_ratio_lm": 0.15,
                         "ttft_speedup_vs_full": 5.0})
    doc = {"rows": rows}
    table.write_text(json.dumps(doc))
    return doc


def test_paired_intervals() -> None:
    ids = [f"t{i:03d}-split-A" for i in range(100)]
    a = {q: float(i % 4 != 0) for i, q in enumerate(ids)}  # 0.75
    same = paired_interval(a, a, ids, "ratio")
    assert same.lo == same.hi == 1.0  # paired: the same questions on both sides
    b = {q: float(i % 2 == 0) for i, q in enumerate(ids)}  # 0.50
    diff = paired_interval(a, b, ids, "diff")
    assert diff.lo < 0.25 < diff.hi and diff.hi - diff.lo < 0.4
    assert paired_interval(a, b, ids, "diff") == diff  # seeded
    mean = mean_interval(a, ids)
    assert mean.lo < 0.75 < mean.hi
    with pytest.raises(ValueError):
        paired_interval(a, b, ids, "product")
    with pytest.raises(ValueError, match="generated question id"):
        family_of("q17")


def test_criteria_with_intervals(tmp_path: Path) -> None:
    table = tmp_path / "run.json"
    doc = _write_run(table)
    scores = read_scores(records_beside(table))
    assert len(scores) == len(RATES) and len(scores[("full_prefill", 1.0)]) == 300
    checks = {c.name: c for c in check(doc, "conduit_per_page", scores=scores)}
    for c in checks.values():
        if "FLOPs" in c.name or "TTFT" in c.name:
            assert c.interval is None
        else:
            assert c.interval is not None and c.value is not None, c.name
            assert c.interval.lo <= c.value + 1e-9 and c.value <= c.interval.hi + 1e-9, c.name
    assert check(doc, "conduit_per_page")[0].interval is None  # no scores, no intervals
    out = tmp_path / "criteria.md"
    assert main(["testbed", "criteria", str(table), "--policy", "conduit_per_page", "--intervals",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "95% paired bootstrap intervals" in text
    assert "| full prefill overall | >= 0.90 | 0." in text and " [0." in text
