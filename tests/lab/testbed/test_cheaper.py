"""The cheaper-default candidates (`lab.testbed.cheaper`): their count rules by hand, and on
random weights (diffuse attention) every candidate reaches its cap, choosing what
`conduit_per_page` chooses scoring, as they do, every layer (the mass floor, the product
default's rule without its boundary: at its depth; its counts by hand are
tests/policies/test_conduit_focus.py's); a count rule's choice under its cap keeps the page
boundary on top (`BoundaryRule`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.model.testbed_model import WEIGHTS
from conduit_core.policies import get_policy
from conduit_core.policies.choice import PolicyOptions
from conduit_core.policies.conduit import ConduitPolicy
from conduit_core.policies.conduit_focus import FocusPolicy
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.runtime import ReuseRuntime
from lab.testbed.batches import page_image
from lab.testbed.cheaper import CHEAPER, KneeCount, MassCount, knee_k
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from lab.testbed.variants import CANDIDATES, BoundaryRule
from tests.lab.testbed.test_boundary_rule import _context
from tests.policies.conftest import PAGE_SIZES, text_page
from worker.prompt import ANSWER_PREFIX, page_label


def test_knee_by_hand() -> None:
    spike = torch.tensor([1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert knee_k(spike, 8, 0.25) == 1  # 10/17 of the mass at 1/8 of the tokens
    two = torch.tensor([0.0, 5.0, 5.0, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert knee_k(two, 8, 0.25) == 2
    assert knee_k(torch.ones(8), 8, 0.25) == 8  # flat: no knee, the cap
    assert knee_k(spike, 8, 0.5) == 8  # a knee less prominent than asked: the cap
    assert knee_k(torch.zeros(8), 8, 0.25) == 8
    assert knee_k(spike, 1, 0.25) == 1 and knee_k(spike, 0, 0.25) == 0
    assert KneeCount(0.25)(spike, 8) == 1 and MassCount(0.5)(spike, 8) == 1


@pytest.fixture(scope="module")
def runtime_and_pages(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReuseRuntime,
                                                                          list[PageInput]]:
    vlm = load_vlm("builtin:tiny-qwen2-vl", cache_dir=Path(tmp_path_factory.mktemp("models")))
    runtime = ReuseRuntime(vlm, never_above_full=False)
    kvs = runtime.prefill_pages([text_page(i, size) for i, size in enumerate(PAGE_SIZES)])
    return runtime, [PageInput(f"Page {i + 1}:", kv) for i, kv in enumerate(kvs)]


@pytest.mark.parametrize("budget", [0.1, 0.3])
def test_random_weights_reach_the_cap(runtime_and_pages: tuple[ReuseRuntime, list[PageInput]],
                                      budget: float) -> None:
    runtime, pages = runtime_and_pages
    assembly = runtime.reuse.assemble("Archive pages.", pages, "Which page names the ledger?")
    ctx = runtime.reuse.policy_context(assembly, budget, 0)
    per_page = get_policy("conduit_per_page")
    assert isinstance(per_page, ConduitPolicy)
    default = per_page.with_options(PolicyOptions(score_layers="all"))(ctx)
    assert 0 < default.numel() == ctx.k
    for name, policy in CHEAPER.items():
        same = per_page(ctx) if isinstance(policy, FocusPolicy) else default
        assert torch.equal(policy(ctx), same), name
    for name in ("cv_adaptive_boundary_32", "cv_floor_30_boundary_64"):
        assert CANDIDATES[name](ctx).numel() <= ctx.k, name  # the cap binds


def test_a_count_under_its_cap_keeps_its_choice_and_the_boundary_on_top() -> None:
    ctx = _context()
    first, second = ctx.layout.segments[0], ctx.layout.segments[1]
    calls: list[int] = []

    def base(c: PolicyContext) -> torch.Tensor:  # page 2's first token on: a quarter of k
        calls.append(c.k)
        return torch.arange(second.start + 1, second.start + 1 + c.k // 4)

    rows = BoundaryRule(base, 16)(ctx).tolist()
    assert calls == [ctx.k]  # it fits: the base's own choice, not one at the budget left
    end = list(range(first.stop - 17, first.stop - 1))  # before page 1's closing delimiter
    assert rows == sorted(end + base(ctx).tolist())
    assert CANDIDATES["cv_adaptive_boundary_32"](ctx).numel() <= ctx.k


def test_conduit_focus_is_the_rule_as_measured() -> None:
    """`cv_floor_30_boundary_64` as measured (the floor rule, `BoundaryRule` on top within k)
    and the product policy `conduit_focus` choose the same rows on the committed checkpoint's
    questions, where attention is focused (its choice under its cap)."""
    measured = BoundaryRule(CHEAPER["cv_mass_floor_30"], 64)
    focus = get_policy("conduit_focus")
    assert CANDIDATES["cv_floor_30_boundary_64"] is focus
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS), never_above_full=False)
    per_page, focused, bounded = get_policy("conduit_per_page"), 0, 0
    for s in probe_samples(12, 28, "distractors"):
        kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        assembly = runtime.reuse.assemble(ANSWER_PREFIX, [
            PageInput(page_label(s.doc_name, p + 1), kv)
            for p, kv in zip(s.pages, kvs, strict=True)], s.text)
        ctx = runtime.reuse.policy_context(assembly, 0.1, 0)
        rows = focus(ctx).cpu()
        assert torch.equal(rows, measured(ctx).cpu()), s.text
        assert rows.numel() <= ctx.k
        focused += not torch.equal(rows, per_page(ctx).cpu())
        bounded += rows.numel() > CHEAPER["cv_mass_floor_30"](ctx).numel()
    assert focused == 12 and bounded > 0  # focused every time, the boundary in some
