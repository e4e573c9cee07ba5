"""The pooled decode step compiled on the CPU (`torch.compile`, inductor, fullgraph): one graph
with no break per bucket, compiled ahead by `prepare`, then no recompilation over 64 steps
while answers join and leave (batch sizes 1 to 16), and the same tokens as the eager step;
attention reads the answers' keys up to a span bucket, and an answer that outgrows its slot
moves to the long tier's slot (or, with none free, to a cache of its own beside the
buckets) while the others stay in theirs, with no compilation after `prepare` (issue 65,
point 5). A one-layer tiny model and few buckets keep the compile cost down (about 25 s a
bucket on two cores)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from conduit_core import AnswerRequest, PageInput, ReuseRuntime, decode
from conduit_core.answer_state import AnswerState
from conduit_core.kv.kv_pool import DecodePool
from conduit_core.model.loader import LoadedVLM
from conduit_core.passes.batch_forward import StepRow, forward_step
from conduit_core.passes.pooled_step import pooled_forward
from conduit_core.passes.step_graphs import StepGraphs, kind_for
from conduit_core.policies import choose_policy
from lab import answering
from lab.gpu.check_parts import one_layer
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES

SLOTS, CAPACITY = 16, 256
SIZES = [4, 16]  # the buckets compiled: a step of 1-4 answers pads to 4, of 5-16 to 16
STEPS = 64


def _schedule() -> list[tuple[int, int]]:
    """(join step, max_new_tokens) of each answer: one joins a step up to 16 running, they
    leave at different steps, and late ones join as the batch shrinks."""
    early = [(i, 18 + (7 * i) % 23) for i in range(16)]
    return [*early, (44, 12), (47, 9), (50, 6), (56, 5)]


def _run(rt: ReuseRuntime, kvs: list[PageInput]) -> tuple[list[list[int]], list[int]]:
    """Every answer of `_schedule` over STEPS steps: token ids, and the batch of each step."""
    plan = _schedule()
    states: list[AnswerState | None] = [None] * len(plan)
    sizes = []
    for step in range(STEPS):
        for i, (join, n) in enumerate(plan):
            live = sum(1 for s in states if s is not None and not s.done)
            if states[i] is None and join <= step and live < SLOTS:
                request = AnswerRequest("Be brief.", [kvs[i % len(kvs)]], f"Question {i}?",
                                        policy=choose_policy("full_reuse"), budget=0.0,
                                        max_new_tokens=n)
                states[i] = answering.start_answer(rt, request)
        live_states = [s for s in states if s is not None and not s.done]
        sizes.append(len(live_states))
        rt.step(live_states)
    assert all(s is not None and s.done for s in states), "every answer ends within STEPS"
    return [list(rt.result(s).token_ids) for s in states if s is not None], sizes


@pytest.fixture(scope="module")
def vlm(model_cache: Path) -> LoadedVLM:
    return one_layer(load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="float32",
                                  device="cpu"))


def _runtime(vlm: LoadedVLM, mode: str, slots: int = SLOTS,
             positions: int = SLOTS * CAPACITY) -> ReuseRuntime:
    rt = ReuseRuntime(vlm, never_above_full=False, decode_slots=slots,
                      decode_positions=positions, decode_compile=mode)
    rt.reuse.stop_ids = []  # every answer runs to its own length
    return rt


def test_the_step_traces_to_one_graph_without_a_break(vlm: LoadedVLM) -> None:
    adapter = vlm.adapter
    cfg = adapter.text_config
    shape = (1, 4, cfg.num_key_value_heads, 128, adapter.layers[0].self_attn.head_dim)
    keys, values = torch.zeros(shape), torch.zeros(shape)
    rows, positions = torch.tensor([5, 9, 0, 0]), torch.tensor([7, 11, 0, 0])
    explained = torch._dynamo.explain(pooled_forward)(
        adapter, keys, values, torch.tensor([3, 4, 5, 6]), rows, positions, 128)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compiled_once_per_bucket_then_no_recompile_and_the_eager_tokens(
        vlm: LoadedVLM, monkeypatch: pytest.MonkeyPatch) -> None:
    assert kind_for("on", "cpu") == "compile" and kind_for("auto", "cpu") == "eager"
    eager = _runtime(vlm, "off")
    kvs = [PageInput(f"Page {i + 1}:\n", kv) for i, kv in
           enumerate(eager.prefill_pages([IMAGES["a"], IMAGES["b"]]))]
    want, want_sizes = _run(eager, kvs)

    torch._dynamo.reset()
    rt = _runtime(vlm, "on")
    rt.pool = DecodePool(rt.adapter, SLOTS, SLOTS * CAPACITY, fixed=True,
                         tiers=[(SLOTS, CAPACITY)])
    rt.graphs = StepGraphs(rt.adapter, rt.pool, "on", sizes=[SIZES], spans=[[CAPACITY]])
    graphs_before = counters["stats"]["unique_graphs"]
    line = rt.prepare_decode(600)
    assert rt.graphs.ready == [(0, b, CAPACITY) for b in SIZES], line
    assert counters["stats"]["unique_graphs"] - graphs_before == len(SIZES)  # one a bucket
    def no_eager(*_args: object) -> None:
        raise AssertionError("a step left the compiled buckets")

    monkeypatch.setattr(decode, "forward_step", no_eager)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got, sizes = _run(rt, kvs)
    assert counters["stats"]["unique_graphs"] - graphs_before == len(SIZES)  # none since
    assert sizes == want_sizes and max(sizes) == SLOTS and 1 in sizes
    assert len(set(sizes)) >= 8  # answers joined and left: many batch sizes
    assert sum(rt.graphs.replays.values()) >= STEPS // 2
    assert got == want


def test_an_answer_that_outgrows_its_slot_moves_and_the_others_stay_compiled(
        vlm: LoadedVLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four answers in a ladder of four 128-position slots and one of 256, compiled at spans
    64 and 128 (short tier) and 256 (long tier). Two answers outgrow their short slots at the
    same step: the first moves to the long slot and its steps run compiled there; the second
    finds it taken, moves to a cache of its own and runs eagerly beside the buckets until the
    first ends, then moves into the long slot too. The two short answers run in their bucket
    at every step (the span following their keys, not the slot), nothing is compiled after
    `prepare` over more than 150 steps, and every answer's tokens are the eager path's."""
    short, long = (4, 128), (1, 256)
    eager = _runtime(vlm, "off", 4, 1024)
    kvs = [PageInput(f"Page {i + 1}:\n", kv) for i, kv in
           enumerate(eager.prefill_pages([IMAGES["a"], IMAGES["b"]]))]
    requests = [AnswerRequest("Be brief.", [kvs[0]], f"Question {i}?",
                              policy=choose_policy("full_reuse"), budget=0.0,
                              max_new_tokens=1) for i in range(4)]
    probe = answering.start_answer(eager, requests[0])
    eager.release(probe)
    prompt = probe.decode.n_keys
    assert prompt < 64, prompt  # the short answers start in the smaller span
    lengths = [30, short[1] - prompt - 10, 150 - prompt, long[1] - prompt - 10]
    requests = [replace(r, max_new_tokens=n) for r, n in zip(requests, lengths, strict=True)]
    want = _together(eager, requests, {})[0]

    torch._dynamo.reset()
    rt = _runtime(vlm, "on", 4, 1024)
    rt.pool = DecodePool(rt.adapter, 4, 1024, fixed=True, tiers=[short, long])
    rt.graphs = StepGraphs(rt.adapter, rt.pool, "on", sizes=[[4], [1]],
                           spans=[[64, 128], [256]])
    graphs_before = counters["stats"]["unique_graphs"]
    line = rt.prepare_decode(600)
    assert rt.graphs.ready == [(0, 4, 64), (0, 4, 128), (1, 1, 256)], line
    assert counters["stats"]["unique_graphs"] - graphs_before == 3  # one a bucket
    seen: dict[str, list[Any]] = {"eager": [], "compiled": []}
    compiled_step = rt.graphs.step

    def observed_step(tier: int, rows: list[StepRow], tokens: list[torch.Tensor]
                      ) -> torch.Tensor:
        seen["compiled"].append((tier, sorted(r.n_keys for r in rows)))
        return compiled_step(tier, rows, tokens)

    def own_caches_only(adapter: Any, rows: list[StepRow], tokens: torch.Tensor,
                        pool: Any = None) -> torch.Tensor:
        assert all(r.slot is None for r in rows), "a pooled answer left its bucket"
        seen["eager"].append(len(rows))
        return forward_step(adapter, rows, tokens, pool)

    monkeypatch.setattr(rt.graphs, "step", observed_step)
    monkeypatch.setattr(decode, "forward_step", own_caches_only)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got, trace = _together(rt, requests, seen)
    assert counters["stats"]["unique_graphs"] - graphs_before == 3  # none since
    assert got == want
    assert len(trace) > 150  # steps
    for going, tiers, eager_rows in trace:
        # every answer in a slot ran compiled in its tier's bucket; only one ran eagerly
        assert eager_rows <= 1 and sum(tiers.values()) + eager_rows == going.total()
        assert tiers == going - Counter({-1: eager_rows}), (tiers, going)
    moved = [i for i, (_, tiers, _) in enumerate(trace) if tiers.get(1)]
    beside = [i for i, (_, _, e) in enumerate(trace) if e]
    assert moved and beside and beside[0] == moved[0]  # the same step: one moved, one out
    assert max(beside) < max(moved)  # the second rejoined the long slot when it freed
    assert set(rt.graphs.replays) == {(0, 4, 64), (0, 4, 128), (1, 1, 256)}, rt.graphs.replays


def _together(rt: ReuseRuntime, requests: list[AnswerRequest], seen: dict[str, list[Any]]
              ) -> tuple[list[list[int]], list[tuple[Counter[int], Counter[int], int]]]:
    """`requests` started together and stepped to their ends: token ids, and for each step
    the answers going on by their slot's tier (-1: none), the rows run compiled by tier and
    the rows run eagerly (from `seen`)."""
    states = [answering.start_answer(rt, r) for r in requests]
    trace = []
    while not all(s.done for s in states):
        compiled, eager = len(seen.get("compiled", [])), len(seen.get("eager", []))
        live = [s for s in states if not s.done]
        rt.step(live)
        tiers: Counter[int] = Counter()
        for tier, keys in seen.get("compiled", [])[compiled:]:
            tiers[tier] += len(keys)
        going = Counter(s.decode.tier if s.decode.slot is not None else -1
                        for s in live if not s.done)
        trace.append((going, tiers, sum(seen.get("eager", [])[eager:])))
    return [list(rt.result(s).token_ids) for s in states], trace
