"""`conduit-lab eval across`: answer evaluations of several checkpoints combined into each
policy's mean and spread, the choice by the mean, and runs of different question sets refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.answers.across import at_equal_flops, choose, combine, discordant
from lab.cli import main

META = {"questions_answered": 4, "pages_mode": "shown", "pages_per_question_mean": 6.0,
        "visual_tokens_per_question_mean": 1548.0, "max_new_tokens": 4}


def _row(group: str, policy: str, budget: float, acc: float, flops: float) -> dict:
    return {"group": group, "policy": policy, "budget": budget, "n": 4, "accuracy": acc,
            "accuracy_ratio_to_full": acc, "agreement_with_full": acc, "flops_ratio_lm": flops,
            "flops_ratio_total": flops, "ttft_ms_median": 10.0, "fallback_share": None,
            "ttft_speedup_vs_full": 1.0 / flops, "ttft_speedup_vs_cached": None}


def _doc(seed: int, a: float, b: float) -> dict:
    """One run: the reference at 1.0, policies `a` and `b` at 0.1 (accuracies a, b) and
    `a` at 0.2, on groups `all` and one family."""
    rows = []
    for group in ("all", "family=split"):
        rows += [_row(group, "full_prefill", 1.0, 1.0, 1.0), _row(group, "pol_a", 0.1, a, 0.2),
                 _row(group, "pol_b", 0.1, b, 0.15), _row(group, "pol_a", 0.2, 1.0, 0.3)]
    return {"meta": {**META, "command": f"conduit-lab eval answers --seed {seed}",
                     "model": f"m{seed}"}, "rows": rows}


def test_mean_spread_and_choice() -> None:
    doc = combine([_doc(0, 0.5, 0.75), _doc(1, 1.0, 0.75), _doc(2, 0.75, 0.5)],
                  ["s0", "s1", "s2"], "conduit-lab eval across ...")
    by = {(r["group"], r["policy"], r["budget"]): r for r in doc["rows"]}
    acc = by[("all", "pol_a", 0.1)]["accuracy"]
    assert acc == {"mean": 0.75, "min": 0.5, "max": 1.0, "runs": [0.5, 1.0, 0.75]}
    assert by[("all", "pol_a", 0.1)]["ttft_speedup_vs_cached"]["mean"] is None
    assert doc["meta"]["budgets"] == [0.1, 0.2] and doc["meta"]["runs"] == ["s0", "s1", "s2"]
    choice = doc["choice"]  # pol_a 0.75 > pol_b 0.667 on the mean
    assert (choice["policy"], choice["runner_up"], choice["budget"]) == ("pol_a", "pol_b", 0.1)
    assert choice["first_in_runs"] == {"pol_a": 2, "pol_b": 1}  # s0 pol_b; s1, s2 pol_a
    tie = combine([_doc(0, 0.5, 0.5)], ["s0"])["rows"]  # equal means: the cheaper one
    assert choose(tie, 0.1)["policy"] == "pol_b"


def test_runs_of_other_questions_are_refused() -> None:
    other = _doc(1, 1.0, 1.0)
    other["meta"]["questions_answered"] = 3
    with pytest.raises(ValueError, match="questions_answered differs"):
        combine([_doc(0, 0.5, 0.5), other], ["s0", "s1"])


def test_discordant_counts_questions_one_policy_alone_answers() -> None:
    recs = [{"id": q, "policy": p, "budget": 0.1, "score": s}
            for q, p, s in [("q1", "a", 1.0), ("q1", "b", 0.0), ("q2", "a", 0.0),
                            ("q2", "b", 0.0), ("q3", "a", 0.0), ("q3", "b", 1.0),
                            ("q4", "a", 1.0), ("q5", "a", 1.0), ("q5", "b", 0.0)]]
    assert discordant(recs, "a", "b", 0.1) == {"n": 4, "a_only": 2, "b_only": 1}
    assert discordant(recs, "a", "b", 0.2) == {"n": 0, "a_only": 0, "b_only": 0}


def test_command_writes_json_markdown_and_plot(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for seed, (a, b) in enumerate([(0.5, 0.75), (1.0, 0.75), (0.75, 0.5)]):
        path = tmp_path / f"final_s{seed}.json"
        path.write_text(json.dumps(_doc(seed, a, b)))
        paths.append(str(path))
    records = tmp_path / "final_s0.records.jsonl"  # one run keeps its per-answer records
    records.write_text("\n".join(json.dumps(x) for x in [
        {"config": {}}, {"id": "q1", "policy": "pol_a", "budget": 0.1, "score": 1.0},
        {"id": "q1", "policy": "pol_b", "budget": 0.1, "score": 0.0}]) + "\n")
    out = tmp_path / "across.json"
    assert main(["eval", "across", *paths, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["choice"]["policy"] == "pol_a"
    assert doc["choice"]["discordant"] == [{"run": "final_s0", "n": 1, "a_only": 1, "b_only": 0}]
    table = out.with_suffix(".md").read_text()
    assert "| pol_a | 0.10 | 0.750 (0.500-1.000) |" in table
    assert "**Best mean accuracy at 0.1: `pol_a`**" in table
    assert "| pol_a | 0.750 (0.500-1.000) |" in table  # the family table at 0.1
    assert "The service's default policy (`CONDUIT_POLICY`): `conduit_per_page`" in table
    assert out.with_suffix(".png").stat().st_size > 5_000
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    capsys.readouterr()
    assert main(["eval", "across", paths[0], str(bad), "--out", str(out)]) == 2
    assert "cannot combine the runs" in capsys.readouterr().err


def test_a_budget_per_question_against_fixed_budgets_at_equal_flops() -> None:
    """The cheapest fixed budget spending at least the per-question budget's FLOPs, and the
    line through full reuse and the fixed budgets; budget-free policies are never chosen."""
    def run(adaptive_acc: float) -> dict:
        rows = [_row("all", "full_prefill", 1.0, 0.9, 1.0),
                _row("all", "full_reuse", 0.1, 0.4, 0.02),
                _row("all", "prefix_reuse", 0.1, 0.9, 1.0),
                _row("all", "conduit", 0.05, 0.8, 0.08), _row("all", "conduit", 0.1, 0.85, 0.14),
                _row("all", "conduit_adaptive", 0.1, adaptive_acc, 0.05)]
        return {"meta": META, "rows": rows}

    doc = combine([run(0.82), run(0.78)], ["s0", "s1"])
    assert doc["choice"]["policy"] == "conduit"  # prefix_reuse's 0.9 is not a budget's
    (found,) = at_equal_flops(doc["rows"], "conduit_adaptive", "conduit")
    assert found["vs_cheapest_above"]["runs"] == pytest.approx([0.02, -0.02])
    assert found["flops_share_of_cheapest_above"]["mean"] == pytest.approx(0.05 / 0.08)
    assert found["vs_interpolated"]["runs"] == pytest.approx([0.22, 0.18])  # line at 0.6
    assert at_equal_flops(doc["rows"], "conduit_adaptive", "no_such_policy") == []
