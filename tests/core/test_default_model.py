"""The service's default model: pages of realistic size, and reuse that pays off on it.

`builtin:small-qwen2-vl` is what `conduit serve` runs with no configuration (the suite runs
its services on the tiny test model instead). On a 3-page question its pages are at least 256
visual tokens each, and CONDUIT at 10% spends well under half of a full prefill's language-
model FLOPs without falling back; after one answer the predicted FLOPs are within 5% of the
measured ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from worker.prompt import ANSWER_PREFIX, page_label
from worker.settings import Settings


def _a4_page(seed: int) -> Image.Image:
    """An A4 page rendered at 100 dpi (827 x 1169 px) with lines of text."""
    img = Image.new("RGB", (827, 1169), "white")
    draw = ImageDraw.Draw(img)
    for y in range(60, 1100, 28):
        draw.text((70, y), f"line {y} of page {seed}: totals, signatures and dates", fill="black")
    return img


def test_the_default_is_the_small_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONDUIT_MODEL", raising=False)
    assert Settings().core.model == "builtin:small-qwen2-vl"


def test_reuse_pays_off_on_the_default_model(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    rt = ReuseRuntime(load_vlm("builtin:small-qwen2-vl", cache_dir=tmp_path))
    kvs = rt.prefill_pages([_a4_page(i) for i in range(3)])
    assert min(kv.num_tokens for kv in kvs) >= 256
    pages = [PageInput(page_label("report.pdf", i + 1), kv) for i, kv in enumerate(kvs)]
    question = "What is the total amount due, and who signed the contract?"
    conduit = answering.answer(rt, AnswerRequest(ANSWER_PREFIX, pages, question, max_new_tokens=2))
    assert not conduit.fallback and conduit.head_tokens > 0
    assert conduit.flops_ratio_lm < 0.35
    # with no earlier answer the estimate places the refreshed tokens evenly (CONDUIT's choice
    # gathers earlier and clusters, so it costs somewhat less); after one answer it places
    # them where that answer's choice fell, and a new question's cost is within 5%
    # (the prediction is of the policy's own work: the head and labels this first answer
    # computed on cache misses are charged to it but never decide its path)
    assert conduit.fill_flops_lm > 0
    own = conduit.flops_used_lm - conduit.fill_flops_lm
    assert conduit.predicted_flops_lm == pytest.approx(own, rel=0.10)
    again = answering.answer(rt,
        AnswerRequest(ANSWER_PREFIX, pages, "Which region grew fastest in 2021?",
                                    max_new_tokens=2))
    assert again.fill_flops_lm == 0.0  # the head and labels are cached now
    assert again.predicted_flops_lm == pytest.approx(again.flops_used_lm, rel=0.05)
    reuse = answering.answer(rt, AnswerRequest(ANSWER_PREFIX, pages, question,
                                               policy=choose_policy("full_reuse"),
                                    max_new_tokens=2))
    assert reuse.flops_ratio_lm < conduit.flops_ratio_lm
