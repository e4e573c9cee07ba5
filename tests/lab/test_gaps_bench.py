"""The stream-gaps bench (`lab.load.gaps`), short, on the tiny builtin with the product's
engine: the tokens are cut into decode steps, the running answers' gaps into the steady ones
(before the newcomers are submitted), those during their prefill and the decode-only ones
after, each with its step's size; a gap is compared with the steady gap of its size; every
newcomer's first token is timed, and a throughput run counts only its window."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from conduit_core.model.loader import load_vlm
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab.load.gaps import (
    STEADY_TOKENS,
    Workload,
    _factory,
    arrivals,
    decode_steps,
    markdown,
    over_steady,
    steady_by_size,
    throughput,
    trial_gaps,
)
from worker import engine as product_engine


@pytest.fixture(scope="module")
def bench() -> tuple[ReuseRuntime, Workload]:
    with tempfile.TemporaryDirectory() as tmp:
        rt = ReuseRuntime(load_vlm("builtin:tiny-qwen2-vl", device="cpu", dtype="float32",
                                   cache_dir=Path(tmp)))
    rt.reuse.stop_ids = []
    return rt, Workload(rt, choose_policy("conduit_per_page"), 0.1)


def test_arrivals_split_the_running_answers_gaps(bench: tuple[ReuseRuntime, Workload]) -> None:
    rt, work = bench
    trial = arrivals(_factory(product_engine), rt, work, running=3, arriving=2, slots=8,
                     running_tokens=60, arriving_tokens=4)
    assert len(trial["ttft"]) == 2 and all(t > 0 for t in trial["ttft"])
    # every running answer's steady gaps counted from when all of them decode, at size 3
    assert len(trial["steady"]) >= 3 * (STEADY_TOKENS // 2)
    assert {n for _, n in trial["steady"]} == {3}
    # two newcomers, three prefill phases each: at least one gap of each running answer ends
    # while they are prefilled, and no gap is counted twice
    assert len(trial["during"]) >= 3 and trial["after"]
    parts = trial["steady"] + trial["during"] + trial["after"]
    assert len(parts) <= 3 * (60 - 1)
    assert min(g for g, _ in parts) > 0 and all(1 <= n <= 5 for _, n in parts)
    assert trial["seconds"]["refreshed"][1] == 3 + 2  # each answer's prefill, timed
    assert trial["seconds"]["decode step"][1] >= 60 - 1


def test_tokens_are_cut_into_decode_steps_and_gaps_at_the_arrivals() -> None:
    # running answers 0 and 1 (1 joins at 1.0), newcomers 2 and 3 submitted at 2.5; newcomer
    # 2's first token at 3.0, 3's at 4.0 (the last), 2's last at 5.0
    log = [(0.0, 0), (1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1), (3.0, 0), (3.0, 1), (3.0, 2),
           (4.0, 0), (4.0, 1), (4.0, 2), (4.0, 3), (5.0, 0), (5.0, 1), (5.0, 2), (5.0, 3),
           (6.0, 0), (6.0, 1), (6.0, 3), (7.0, 0), (7.0, 1)]
    assert [len(s) for s in decode_steps(log)] == [1, 2, 2, 3, 4, 4, 3, 2]
    parts = trial_gaps(log, running=2, submitted=2.5)
    assert sorted(parts["steady"]) == [(1.0, 2)] * 2  # 1-2 of both; not 0-1 (1 not yet in)
    assert sorted(parts["during"]) == [(1.0, 3)] * 2 + [(1.0, 4)] * 2  # ending 3.0 and 4.0
    assert sorted(parts["after"]) == [(1.0, 2)] * 2 + [(1.0, 3)] * 2 + [(1.0, 4)] * 2
    assert parts["ttft"] == [0.5, 1.5]


def test_each_gap_is_compared_with_the_steady_gap_of_its_size() -> None:
    steady = steady_by_size([(0.02, 8), (0.03, 8), (0.025, 8), (0.04, 16), (0.04, 16)])
    assert steady == {8: 0.025, 16: 0.04}
    ratios = over_steady([(0.05, 8), (0.08, 16), (0.065, 12), (0.05, 4), (0.08, 20)], steady)
    # size 12 reads the line between 8 and 16; sizes beyond read the nearest end
    assert ratios == pytest.approx([2.0, 2.0, 2.0, 2.0, 2.0])


def test_a_throughput_run_counts_its_window(bench: tuple[ReuseRuntime, Workload]) -> None:
    rt, work = bench
    rate = throughput(_factory(product_engine), rt, work, slots=4, clients=4, warmup_s=0.5,
                      duration_s=1.5, max_new_tokens=8)
    assert rate["answers_per_s"] > 0
    assert rate["tokens_per_s"] >= 8 * rate["answers_per_s"] * 0.5  # tokens of whole answers
    assert 1 < rate["rows_per_step"] <= 4 and rate["steps_per_prefill"] > 1  # batched


def test_markdown_names_both_engines() -> None:
    row = {"steady_gap_ms": 10.0, "during_ms": {"p50": 12.0, "p99": 15.0, "max": 16.0},
           "over_steady": {"p50": 1.1, "p99": 1.5, "max": 1.6}, "p99_over_steady": 1.5,
           "p99_over_running_steady": 1.8, "largest_batch_over_running": 1.3,
           "newcomer_ttft_ms": {"p50": 30.0, "max": 40.0},
           "mean_ms": {"decode step": 9.0, "refreshed": 20.0},
           "answers_per_s": [1.0], "tokens_per_s": [64.0], "rows_per_step": [3.5],
           "steps_per_prefill": [4.0]}
    doc = {"date": "2026-12-07", "command": "conduit-lab bench gaps", "model": "m",
           "policy": "conduit_per_page", "budget": 0.1, "baseline": "abc", "running": 8,
           "running_tokens": 160, "arriving": 8, "arriving_tokens": 32, "slots": 16,
           "repeats": 1, "clients": 32, "duration_s": 15.0, "warmup_s": 8.0,
           "max_new_tokens": 64, "pairs": 1, "engines": {"before": row, "after": row},
           "tokens_per_s_after_over_before": [1.0], "throughput_after_over_before": 1.0}
    text = markdown(doc)
    assert "| before | 10.0 | 12.0 | 15.0 | 16.0 | 1.1x | **1.5x** | 1.6x | 1.8x | 30.0 |" in text
    assert "| after |" in text and "1.3x (before)" in text
    assert "| engine | decode step | refreshed |" in text and "| before | 9.0 | 20.0 |" in text
    assert "| after | 1.0 | 64.0 | 3.5 | 4.0 |" in text
