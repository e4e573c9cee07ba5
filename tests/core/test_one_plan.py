"""One plan per question (issue 59, point 5): an answer depends on the request, the settings
and the model only, never on which caches are warm, and every FLOP it computes is charged.

The grid asks every product policy at several budgets over 1-3 pages (float and int8 page
KV), in two orders on fresh runtimes and once more warm: the tokens, the path (fallback or
not) and the path's own charged FLOPs (`tests.core.helpers.own_flops`) are the same each time;
what the caches cost is charged once, to whichever answer filled them (the sum over the grid
is the same in both orders). A FLOP counter (`torch.utils.flop_counter`) around the prefill
half of each answer agrees with its charged LM FLOPs within 1%, on cold and warm runtimes.
The grid holds every product policy (`conduit_focus` at its cap on these random weights);
one question on the trained testbed checkpoint holds it where it chooses its own
count under the cap, predicted from its history.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput
from conduit_core.cost.cost_model import RowCosts
from conduit_core.model.flops import SCORE_PAIR_FLOPS, LMShape
from conduit_core.model.loader import LoadedVLM
from conduit_core.model.testbed_model import WEIGHTS
from conduit_core.page_kv import PageKV
from conduit_core.pass_observer import Phase
from conduit_core.passes.assembly import Assembly
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import PolicyOptions
from conduit_core.policies.registry import PRODUCT_POLICIES
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.testbed.batches import page_image
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from storage.kv.codec import decode_page, encode_page
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES, own_flops
from worker.prompt import ANSWER_PREFIX, page_label

MODEL = "builtin:tiny-qwen2-vl"
BUDGETS = (0.05, 0.1, 0.3, 1.0)
SCOPES = (("a",), ("b", "c"), ("c", "a", "b"))  # 1-3 pages
QUESTIONS = {("a",): "What does the first page show?", ("b", "c"): "Compare the two pages.",
             ("c", "a", "b"): "Which page holds the table?"}
GRID = list(itertools.product(SCOPES, sorted(PRODUCT_POLICIES), BUDGETS))


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> LoadedVLM:
    return load_builtin(MODEL, tmp_path_factory.mktemp("models"), dtype="float32",
                        device="cpu")


@pytest.fixture(scope="module", params=["float", "int8"])
def pages(request: pytest.FixtureRequest, vlm: LoadedVLM) -> dict[str, PageKV]:
    """The three pages' KV, as computed or as the store's int8 form reads them back."""
    kvs = ReuseRuntime(vlm).prefill_pages([IMAGES[k] for k in "abc"])
    if request.param == "int8":
        kvs = [decode_page(encode_page(kv, quantize=True).to_bytes()) for kv in kvs]
    return dict(zip("abc", kvs, strict=True))


def _request(pages: dict[str, PageKV], scope: tuple[str, ...], policy: str,
             budget: float) -> AnswerRequest:
    return AnswerRequest(prefix="Answer from the pages.",
                         pages=[PageInput(f"[{k}.pdf p.1]", pages[k]) for k in scope],
                         question=QUESTIONS[scope], policy=choose_policy(policy), budget=budget,
                         max_new_tokens=3, namespace="tenant-a")


def _run(rt: ReuseRuntime, pages: dict[str, PageKV],
         grid: list[tuple[tuple[str, ...], str, float]]) -> dict[tuple, AnswerResult]:
    return {cell: answering.answer(rt, _request(pages, *cell)) for cell in grid}


def test_answers_and_charges_do_not_depend_on_what_ran_before(
        vlm: LoadedVLM, pages: dict[str, PageKV]) -> None:
    first_rt = ReuseRuntime(vlm)
    cold = _run(first_rt, pages, GRID)
    warm = _run(first_rt, pages, GRID)  # every cache filled by the first round
    reverse = _run(ReuseRuntime(vlm), pages, GRID[::-1])
    assert any(r.fallback for r in cold.values()) and not all(r.fallback for r in cold.values())
    for cell in GRID:
        runs = (cold[cell], warm[cell], reverse[cell])
        assert len({tuple(r.token_ids) for r in runs}) == 1, cell
        assert len({r.fallback for r in runs}) == 1, cell
        assert len({r.refreshed_visual_tokens for r in runs}) == 1, cell
        assert own_flops(cold[cell]) == own_flops(warm[cell]) == own_flops(reverse[cell])
        assert warm[cell].fill_flops_lm == 0.0, cell
    fills = [sum(r.fill_flops_lm for r in run.values()) for run in (cold, reverse)]
    assert fills[0] > 0 and fills[0] == pytest.approx(fills[1], rel=1e-12)


def _cpu_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              dropout_p: float = 0.0, is_causal: bool = False, *args: object,
              out_val: object = None, **kwargs: object) -> int:
    """FLOPs of the CPU fused attention kernel (torch's counter has no formula for it): the
    pairs it computes (top-left causal, or every query with every key), QK^T and PV."""
    b, heads, lq, d = query.shape
    lk, dv = key.shape[2], value.shape[3]
    pairs = sum(min(lk, i + 1) for i in range(lq)) if is_causal else lq * lk
    return 2 * b * heads * pairs * (d + dv)


_cpu_sdpa._get_raw = True  # type: ignore[attr-defined]  # torch's counter: raw arguments


class ScoringTerms:
    """A `PassObserver` that adds up the scoring pass's element-wise terms (softmax, the
    norm-weighted reduction, value norms: `conduit_core.model.flops.scoring_flops` less its
    QK^T), which a matmul counter cannot see, after each scoring pass of `runtime`."""

    def __init__(self, runtime: ReuseRuntime) -> None:
        self.shape: LMShape = runtime.reuse.flops.lm
        self.n_layers = len(runtime.adapter.layers)
        self.extra = 0.0

    @contextmanager
    def phase(self, name: Phase, assembly: Assembly) -> Iterator[None]:
        yield
        if name != "scoring":
            return
        assert assembly.stale is not None
        config, layout, shape = assembly.stale.config, assembly.layout, self.shape
        scored = len(range(self.n_layers)[config.layer_slice(self.n_layers)])
        rows = int(config.scored_rows(int(layout.question_rows().numel()),
                                      layout.prompt).numel())
        self.extra += scored * (rows * layout.n * shape.heads * SCORE_PAIR_FLOPS
                                + 2 * shape.kv_heads * shape.head_dim * layout.n)


def counted_answer(rt: ReuseRuntime, request: AnswerRequest) -> tuple[AnswerResult, float]:
    """Answer `request` on `rt` under a FLOP counter: the result, and the prefill's LM FLOPs
    the counter saw (matmuls, the CPU attention kernel, the scoring pass's element-wise terms;
    the first token's logits left out), to compare with the charge."""
    vocab = int(rt.vlm.model.config.get_text_config().vocab_size)
    terms = ScoringTerms(rt)
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa})
    with counter, answering.observing(rt, terms):
        state = answering.start_answer(rt, request)
    result = answering.finish(rt, state)
    return result, counter.get_total_flops() - 2 * rt.reuse.flops.lm.hidden * vocab + terms.extra


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_flop_counter_agrees_with_the_charge(vlm: LoadedVLM, pages: dict[str, PageKV],
                                               warm: bool) -> None:
    for scope, policy, budget in GRID:
        rt = ReuseRuntime(vlm)
        request = _request(pages, scope, policy, budget)
        if warm:
            answering.answer(rt, request)
        result, counted = counted_answer(rt, request)
        assert counted == pytest.approx(result.flops_used_lm, rel=0.01), (scope, policy, budget)
        assert (result.fill_flops_lm == 0.0) == warm, (scope, policy, budget)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_short_scoring_pass_is_charged_as_counted(vlm: LoadedVLM, pages: dict[str, PageKV],
                                                    warm: bool) -> None:
    """A scoring pass that stops after its last scored layer (a depth, a range), and the
    refresh that then computes every text row, are charged what a FLOP counter sees; the
    same tokens and charge cold and warm, with labels refreshed always or by page."""
    depths: list[float | tuple[int, int]] = [0.5, (0, 1)]
    for refresh, layers in itertools.product(("always", "page"), depths):
        rt = ReuseRuntime(vlm, label_refresh=refresh)  # type: ignore[arg-type]
        request = replace(_request(pages, ("c", "a", "b"), "conduit_per_page", 0.1),
                          policy=choose_policy("conduit_per_page",
                                               PolicyOptions(score_layers=layers)))
        first = answering.answer(rt, request) if warm else None
        result, counted = counted_answer(rt, request)
        assert not result.fallback, (refresh, layers)
        assert counted == pytest.approx(result.flops_used_lm, rel=0.01), (refresh, layers)
        if first is not None:
            assert first.token_ids == result.token_ids
            assert own_flops(first) == own_flops(result)


def test_a_focused_choice_is_one_plan_cold_or_warm() -> None:
    """The grid's random weights leave `conduit_focus` at its cap; on the committed testbed
    checkpoint it refreshes fewer than k. Its prediction then learns the
    share of k it refreshed (the warm answer is predicted lower), while the tokens, the path
    and the charged FLOPs stay the same cold, warm and on a fresh runtime, and a FLOP counter
    agrees with the charge."""
    vlm = load_checkpoint_vlm(WEIGHTS)
    sample = next(iter(probe_samples(1, 28, "distractors")))
    rt = ReuseRuntime(vlm)
    kvs = rt.prefill_pages([page_image(sample.doc.pages[p]) for p in sample.pages])
    request = AnswerRequest(ANSWER_PREFIX, [
        PageInput(page_label(sample.doc_name, p + 1), kv)
        for p, kv in zip(sample.pages, kvs, strict=True)], sample.text,
        policy=choose_policy("conduit_focus"), budget=0.1, max_new_tokens=4)
    asm = rt.reuse.assemble(request.prefix, request.pages, request.question)
    k = rt.reuse.policy_context(asm, 0.1).k
    cold, counted = counted_answer(rt, request)
    warm = answering.answer(rt, request)
    fresh = answering.answer(ReuseRuntime(vlm), request)
    assert not cold.fallback and 0 < cold.refreshed_visual_tokens < k
    assert cold.predicted_flops_lm > 1.2 * own_flops(cold)  # k rows evenly, with no history
    assert warm.predicted_flops_lm == pytest.approx(own_flops(cold), rel=0.05)  # the share
    assert fresh.predicted_flops_lm == cold.predicted_flops_lm  # at the cap, no history
    for other in (warm, fresh):
        assert other.token_ids == cold.token_ids and other.fallback == cold.fallback
        assert other.refreshed_visual_tokens == cold.refreshed_visual_tokens
        assert own_flops(other) == own_flops(cold)
    assert counted == pytest.approx(cold.flops_used_lm, rel=0.01)


def test_the_counter_sees_an_uncharged_pass(vlm: LoadedVLM, pages: dict[str, PageKV],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails when a pass goes uncharged: the scoring pass's charge dropped."""
    monkeypatch.setattr(RowCosts, "scoring", lambda *args, **kwargs: 0.0)
    rt = ReuseRuntime(vlm)
    request = _request(pages, ("c", "a", "b"), "conduit", 0.1)
    answering.answer(rt, request)
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa})
    with counter:
        state = answering.start_answer(rt, request)
    result = answering.finish(rt, state)
    assert not result.fallback
    assert counter.get_total_flops() > 1.05 * result.flops_used_lm
