"""Every policy on every builtin family: budget 1.0 reproduces full prefill, and a budgeted
policy refreshes exactly round(budget * N_v) visual tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.builtin import builtin_names
from conduit_core.model.flops import LMShape, full_prefill_flops, trimmed_rows_flops
from conduit_core.model.loader import load_vlm
from conduit_core.policies import POLICIES, choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.refresh_probe import probe_full_prefill, probe_refresh
from tests.device import TEST_DEVICE, TEST_DTYPE, tol

from .conftest import PAGE_SIZES, text_page

PREFIX, QUESTION = "Scanned pages follow.", "What is written in the margin?"
LABELS = ["One:", "Two:", "Three:"]


@pytest.mark.parametrize("name", [n for n in builtin_names() if n.startswith("builtin:tiny-")])
def test_all_policies_on_family(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    # the policies' own paths, also where one costs more than a full prefill (tiny pages)
    rt = ReuseRuntime(load_vlm(name, cache_dir=Path(tmp_path_factory.mktemp("m")),
                               device=TEST_DEVICE, dtype=TEST_DTYPE), never_above_full=False)
    images = [text_page(10 + i, size) for i, size in enumerate(PAGE_SIZES)]
    pages = [PageInput(label, kv) for label, kv in zip(LABELS, rt.prefill_pages(images),
                                                       strict=True)]
    ref = probe_full_prefill(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION,
                             logits="all")
    n_v = sum(p.kv.num_tokens for p in pages)
    shape = LMShape.from_config(rt.adapter.text_config)
    for policy in POLICIES:
        if policy != "full_reuse":
            got = probe_refresh(rt, AnswerRequest(prefix=PREFIX, pages=pages, question=QUESTION,
                                                  policy=choose_policy(policy), budget=1.0),
                                                  logits="all")
            assert got.logits.shape == ref.logits.shape, policy
            torch.testing.assert_close(got.logits, ref.logits, **tol("logits"), msg=policy)
        if policy in ("conduit", "cacheblend", "random", "epic"):
            req = AnswerRequest(prefix=PREFIX, pages=pages, question=QUESTION,
                                policy=choose_policy(policy), budget=0.25, max_new_tokens=2)
            result = answering.answer(rt, req)
            probe = probe_refresh(rt, req, last_only=True)
            assert result.refreshed_visual_tokens == round(0.25 * n_v), policy
            # the analytic accounting: the policy's own work (scoring pass, check layers)
            # plus the refresh as computed, over L [N c + 4 H dh N (N + 1) / 2] less the
            # last layer's attention and MLP of every row but the last (`trimmed`)
            n = int(ref.rows.numel())
            full_lm = trimmed_rows_flops(shape, torch.arange(n), shape.layers,
                                         torch.arange(n) + 1, torch.tensor([n]))
            assert full_lm < full_prefill_flops(shape, n)
            used = probe.extra_flops + probe.refresh_flops
            assert result.flops_full_lm == pytest.approx(full_lm)
            assert result.flops_used_lm == pytest.approx(used) and used > 0
            assert result.flops_ratio_lm == pytest.approx(used / full_lm)
            vision = rt.adapter.vision_flops([p.kv.image_grid for p in pages])
            assert result.flops_ratio_total == pytest.approx(used / (full_lm + vision))
