"""Every policy on every builtin family: budget 1.0 reproduces full prefill, and a budgeted
policy refreshes exactly round(budget * N_v) visual tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.builtin import builtin_names
from conduit_core.loader import load_vlm
from conduit_core.policies import POLICIES
from conduit_core.refresh_probe import probe_full_prefill, probe_refresh
from conduit_core.runtime import ReuseRuntime

from .conftest import PAGE_SIZES, text_page

PREFIX, QUESTION = "Scanned pages follow.", "What is written in the margin?"
LABELS = ["One:", "Two:", "Three:"]


@pytest.mark.parametrize("name", builtin_names())
def test_all_policies_on_family(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    rt = ReuseRuntime(load_vlm(name, cache_dir=Path(tmp_path_factory.mktemp("m"))))
    images = [text_page(10 + i, size) for i, size in enumerate(PAGE_SIZES)]
    pages = [PageInput(label, kv) for label, kv in zip(LABELS, rt.prefill_pages(images),
                                                       strict=True)]
    ref = probe_full_prefill(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION)
    n_v = sum(p.kv.num_tokens for p in pages)
    for policy in POLICIES:
        if policy != "full_reuse":
            got = probe_refresh(rt, AnswerRequest(prefix=PREFIX, pages=pages, question=QUESTION,
                                                  policy=policy, budget=1.0))
            assert torch.allclose(got.logits, ref.logits, atol=1e-4, rtol=0), policy
        if policy in ("conduit", "cacheblend", "random", "epic"):
            result = rt.answer(AnswerRequest(prefix=PREFIX, pages=pages, question=QUESTION,
                                             policy=policy, budget=0.25, max_new_tokens=2))
            assert result.refreshed_visual_tokens == round(0.25 * n_v), policy
            assert 0.0 < result.flops_ratio < 1.5
