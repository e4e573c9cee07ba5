"""The fidelity evaluation (`conduit-lab eval fidelity`): its metrics by hand, and a small
end-to-end run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import AnswerResult
from lab.fidelity.data import make_cases
from lab.fidelity.evaluate import continuation_match, kl_divergence, run_fidelity_eval


def result(tokens: list[int], stop: bool) -> AnswerResult:
    return AnswerResult(text="", token_ids=tokens, ttft_s=0.0, total_s=0.0,
                        refreshed_visual_tokens=0, visual_tokens=0, flops_full_lm=1.0,
                        flops_vision=0.0, flops_used_lm=1.0, flops_used_vision=0.0,
                        stop_reason="stop" if stop else "length")


def test_kl_by_hand() -> None:
    p = torch.tensor([0.5, 0.5]).log()
    q = torch.tensor([0.25, 0.75]).log()
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert kl_divergence(p, p + 3.0) == pytest.approx(0.0, abs=1e-12)


def test_continuation_match_by_hand() -> None:
    assert continuation_match(result([1, 2, 3, 4], False), result([1, 2, 9, 4], False)) == 0.5
    assert continuation_match(result([1, 2], True), result([1, 2], True)) == 1.0
    longer = continuation_match(result([1, 2], True), result([1, 2, 5], False))
    assert longer == pytest.approx(2 / 3)
    assert continuation_match(result([], True), result([7], False)) == 0.0


def test_cases_are_deterministic_and_distinct() -> None:
    a, b = make_cases(2, 3, seed=5), make_cases(2, 3, seed=5)
    assert [c.prefix for c in a] == [c.prefix for c in b]
    assert a[0].images[0].tobytes() == b[0].images[0].tobytes()
    assert a[0].images[0].tobytes() != a[0].images[1].tobytes()
    assert a[0].labels == ["Page 1 of 3:", "Page 2 of 3:", "Page 3 of 3:"]


def test_small_run_writes_json_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "fid.json"
    doc = run_fidelity_eval(model="builtin:tiny-qwen2-vl", pages=2, budgets=[0.2, 1.0],
                            policies=["full_prefill", "full_reuse", "conduit", "random"],
                            samples=2, out=out, cache_dir=tmp_path / "models",
                            max_new_tokens=4, command="test")
    assert json.loads(out.read_text()) == doc
    rows = {(r["policy"], r["budget"]): r for r in doc["rows"]}
    assert len(rows) == 8
    keys = {"policy", "budget", "top1_agreement", "kl", "continuation_match", "flops_ratio_lm",
            "flops_ratio_total", "seconds"}
    assert all(keys <= set(r) for r in doc["rows"])
    for policy in ("full_prefill", "conduit", "random"):
        exact = rows[(policy, 1.0)]
        assert exact["top1_agreement"] == 1.0 and exact["continuation_match"] == 1.0
        assert exact["kl"] < 1e-8
    stale = rows[("full_reuse", 0.2)]
    assert stale["kl"] > 1e-6  # the new prefix makes reused pages measurably stale
    # reuse never pays the vision tower: the full_prefill policy over cached pages spends the
    # language model's prefill but for the cached prompt head, and none of the tower's
    assert 0.5 < rows[("full_prefill", 0.2)]["flops_ratio_lm"] < 1.0
    assert rows[("full_prefill", 0.2)]["flops_ratio_total"] < 1.0
    # conduit pays scoring + refresh on top of full reuse
    assert stale["flops_ratio_lm"] < rows[("conduit", 0.2)]["flops_ratio_lm"]
    table = out.with_suffix(".md").read_text()
    assert "| conduit | 0.20 |" in table and "test" in table
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        run_fidelity_eval(model="builtin:tiny-qwen2-vl", policies=["nope"], samples=1,
                          out=out, cache_dir=tmp_path / "models")
