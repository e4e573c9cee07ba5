"""The stream-gaps bench (`lab.load.gaps`), short, on the tiny builtin with the product's
engine: the running answers' gaps are split into the steady ones (before the newcomers are
submitted) and those during their prefill, every newcomer's first token is timed, and a
throughput run counts only its window."""

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
    markdown,
    split_gaps,
    throughput,
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
    # every running answer's steady gaps counted from when all of them decode
    assert len(trial["steady"]) >= 3 * (STEADY_TOKENS // 2)
    # two newcomers, three prefill phases each: at least one gap of each running answer ends
    # while they are prefilled, and no gap is counted twice
    assert len(trial["during"]) >= 3
    assert len(trial["steady"]) + len(trial["during"]) <= 3 * (60 - 1)
    assert min(trial["steady"] + trial["during"]) > 0
    assert trial["seconds"]["refreshed"][1] == 3 + 2  # each answer's prefill, timed
    assert trial["seconds"]["decode step"][1] >= 60 - 1


def test_gaps_are_split_at_the_arrivals() -> None:
    # two running answers; all decode from 1.0, newcomers at 3.0, the last first token at 5.0
    times = [[0.0, 1.0, 2.0, 3.0, 4.5, 5.5, 7.0], [1.0, 2.5, 3.5, 4.0, 6.0]]
    steady, during = split_gaps(times, steady_from=1.0, submitted=3.0, last_first=5.0)
    assert sorted(steady) == [1.0, 1.0, 1.5]  # 1-2, 2-3 and 1-2.5; not 0-1, not 2.5-3.5
    assert sorted(during) == [0.5, 1.0, 1.0, 1.5, 2.0]  # 3-4.5, 4.5-5.5, 2.5-3.5, 3.5-4, 4-6


def test_a_throughput_run_counts_its_window(bench: tuple[ReuseRuntime, Workload]) -> None:
    rt, work = bench
    rate = throughput(_factory(product_engine), rt, work, slots=4, clients=4, warmup_s=0.5,
                      duration_s=1.5, max_new_tokens=8)
    assert rate["answers_per_s"] > 0
    assert rate["tokens_per_s"] >= 8 * rate["answers_per_s"] * 0.5  # tokens of whole answers
    assert 1 < rate["rows_per_step"] <= 4 and rate["steps_per_prefill"] > 1  # batched


def test_markdown_names_both_engines() -> None:
    row = {"steady_gap_ms": 10.0, "during_ms": {"p50": 12.0, "p99": 15.0, "max": 16.0},
           "p99_over_steady": 1.5, "newcomer_ttft_ms": {"p50": 30.0, "max": 40.0},
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
    assert "| before | 10.0 | 12.0 | 15.0 | 16.0 | 1.5x |" in text and "| after |" in text
    assert "| engine | decode step | refreshed |" in text and "| before | 9.0 | 20.0 |" in text
    assert "| after | 1.0 | 64.0 | 3.5 | 4.0 |" in text
