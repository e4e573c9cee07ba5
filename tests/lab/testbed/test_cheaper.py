"""The cheaper-default candidates (`lab.testbed.cheaper`): their count rules by hand, and on
random weights (diffuse attention) every candidate reaches its cap, choosing what
`conduit_per_page` chooses scoring, as they do, every layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import get_policy
from conduit_core.policies.choice import PolicyOptions
from conduit_core.policies.conduit import ConduitPolicy
from conduit_core.runtime import ReuseRuntime
from lab.testbed.cheaper import CHEAPER, KneeCount, MassCount, knee_k
from tests.policies.conftest import PAGE_SIZES, text_page


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
        assert torch.equal(policy(ctx), default), name
