"""A new question's scoring pass and refresh run in layer groups between decode steps.

`ReuseRuntime(layer_group=g)` makes `prefill_steps` yield between groups of g decoder layers
of the scoring pass ("scoring") and of the refresh ("refresh"). Driven as the answer engine
drives it (one decode step of the running answers after every phase), a running answer gets
a token between the groups of a newcomer's refresh, and both answers' tokens are the ones the
unsplit runtime gives: cutting a pass changes when its layers run, not what they compute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.answer_state import AnswerState
from conduit_core.passes.layer_groups import drain, layer_groups
from conduit_core.policies import choose_policy
from lab import answering
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES

FAMILY = "builtin:tiny-qwen2-vl"


def _requests(rt: ReuseRuntime) -> tuple[AnswerRequest, AnswerRequest]:
    """A long-running answer and a newcomer over two pages, CONDUIT at a 30% budget."""
    kvs = rt.prefill_pages([IMAGES["a"], IMAGES["b"]])
    pages = [PageInput(f"Page {i + 1}:\n", kv) for i, kv in enumerate(kvs)]
    running = AnswerRequest("Be brief.", pages[:1], "What is it?", policy=choose_policy(
        "conduit"), budget=0.3, max_new_tokens=48)
    newcomer = AnswerRequest("Be brief.", pages, "Which page has the larger table?",
                             policy=choose_policy("conduit"), budget=0.3, max_new_tokens=6)
    return running, newcomer


def _finish(rt: ReuseRuntime, states: list[AnswerState]) -> None:
    while not all(s.done for s in states):
        rt.step([s for s in states if not s.done])


def test_layer_groups_cover_the_layers_in_order() -> None:
    assert layer_groups(range(1, 8), 3) == [range(1, 4), range(4, 7), range(7, 8)]
    assert layer_groups(range(1, 8), 0) == [range(1, 8)]
    assert layer_groups(range(0, 4), 9) == [range(0, 4)]


@pytest.mark.parametrize("group", [1, 2])
def test_running_answer_decodes_between_a_newcomers_refresh_groups(
        model_cache: Path, group: int) -> None:
    vlm = load_builtin(FAMILY, model_cache)
    whole = ReuseRuntime(vlm, never_above_full=False)  # the policy, not its fallback
    split = ReuseRuntime(vlm, never_above_full=False, layer_group=group)
    running, newcomer = _requests(split)
    alone = [answering.answer(whole, r).token_ids for r in (running, newcomer)]

    first = drain(split.prefill_steps(running))
    split.step([first])
    steps, phases, tokens = split.prefill_steps(newcomer), [], []
    while True:
        try:
            phases.append(next(steps))
        except StopIteration as done:
            second: AnswerState = done.value
            break
        split.step([first])  # the engine: a decode step of the running batch after a phase
        tokens.append(len(first.decode.tokens))
    n_layers = len(vlm.adapter.layers)
    # the refresh starts at layer 1 after a scoring pass: its later groups each yield, and
    # one-layer groups between their attention and MLP too (the last layer, which computes
    # the last row only, excepted)
    groups = layer_groups(range(1, n_layers), group)
    halves = len(groups) - 1 if group == 1 else 0
    assert phases.count("refresh") == len(groups) - 1 + halves > 0
    assert phases.count("scoring") == len(layer_groups(range(n_layers), group)) - 1
    assert phases[0] == "assembled" and "chosen" in phases
    for i, phase in enumerate(phases):  # a token of the running answer after every phase
        assert phase and tokens[i] == (tokens[i - 1] if i else 1) + 1
    _finish(split, [first, second])
    got = [split.result(s).token_ids for s in (first, second)]
    assert got == alone


def test_split_passes_compute_what_whole_passes_do(model_cache: Path) -> None:
    vlm = load_builtin(FAMILY, model_cache)
    whole, split = ReuseRuntime(vlm), ReuseRuntime(vlm, layer_group=1)
    _, newcomer = _requests(whole)
    out = []
    for rt in (whole, split):
        asm = rt.reuse.assemble(newcomer.prefix, newcomer.pages, newcomer.question)
        scores, _ = rt.reuse.scoring(asm)
        visual = asm.layout.visual_rows()[::3]  # (V,)
        hidden, _ = rt.reuse.refresh(asm, visual)  # (R, hidden)
        out.append((scores.weighted, hidden, asm.cache.keys[:, :, :, :asm.layout.n].clone()))
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)
