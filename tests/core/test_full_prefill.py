"""Exactness 1: the runtime's full prefill reproduces the transformers model itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import ReuseRuntime
from conduit_core.decode import printable
from lab import answering
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES, reference_logits, until_stop
from tests.device import atol, same_answer

PAGES = [("Page 1:\n", IMAGES["a"]), ("Page 2:\n", IMAGES["b"])]
PREFIX, QUESTION = "You answer questions about documents.", "What is the total amount?"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", FAMILIES)
def test_full_prefill_logits_match_model_forward(name: str, attn: str, model_cache: Path) -> None:
    vlm = load_builtin(name, model_cache, attn=attn)
    rt = ReuseRuntime(vlm)
    asm = answering.assemble_fresh(rt, PREFIX, PAGES, QUESTION)
    logits = rt.reuse.logits(answering.prefill(rt, asm, asm.layout.visual_rows()))  # (N, vocab)
    ref = reference_logits(vlm, asm, [img for _, img in PAGES])
    assert logits.shape == ref.shape
    assert (logits - ref).abs().max().item() <= atol("logits")


@pytest.mark.parametrize("name", FAMILIES)
def test_full_prefill_greedy_tokens_match_generate(name: str, model_cache: Path) -> None:
    vlm = load_builtin(name, model_cache)
    rt = ReuseRuntime(vlm)
    result = answering.answer_full_prefill(rt, PREFIX, PAGES, QUESTION, max_new_tokens=8)
    asm = answering.assemble_fresh(rt, PREFIX, PAGES, QUESTION)
    prepared = vlm.adapter.prepare_pages([img for _, img in PAGES])
    kwargs = vlm.adapter.reference_inputs(asm.layout.token_ids, prepared)
    gen = vlm.model.generate(**kwargs, max_new_tokens=8, do_sample=False)[0, asm.layout.n:]
    expected = until_stop(gen.tolist(), vlm.adapter.stop_token_ids())
    assert same_answer(result.token_ids, expected)
    assert len(expected) > 0
    if result.token_ids == expected:
        assert result.text == printable(vlm.tokenizer.decode(expected,
                                                             skip_special_tokens=True))
    assert result.prompt_tokens == asm.layout.n
    # FLOPs by the formula written out from the config: L [N c + 4 H dh N (N + 1) / 2]
    cfg = vlm.adapter.text_config
    d, heads, g = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or d // heads
    c = 2 * (2 * d * heads * hd + 2 * d * g * hd + 3 * d * cfg.intermediate_size)
    n = asm.layout.n
    lm = cfg.num_hidden_layers * (n * c + 4 * heads * hd * n * (n + 1) / 2)
    # less what the last layer skips for the rows whose output nothing reads (all but the
    # last one: they project q, k and v there, and attend or run the MLP no more)
    proj = 2 * (d * heads * hd + 2 * d * g * hd)
    lm -= (n - 1) * (c - proj) + 4 * heads * hd * (n * (n + 1) / 2 - n)
    assert result.flops_full_lm == result.flops_used_lm == pytest.approx(lm)
    assert result.flops_used_vision == result.flops_vision > 0  # full prefill runs the tower
    assert result.flops_ratio_lm == result.flops_ratio_total == 1.0
    assert 0 < result.ttft_s <= result.total_s


def test_text_only_request(model_cache: Path) -> None:
    vlm = load_builtin("builtin:tiny-qwen2-vl", model_cache)
    rt = ReuseRuntime(vlm)
    asm = answering.assemble_fresh(rt, PREFIX, [], QUESTION)
    logits = rt.reuse.logits(answering.prefill(rt, asm, asm.layout.visual_rows()))
    ids = asm.layout.token_ids.view(1, -1)
    with torch.no_grad():
        ref = vlm.model(input_ids=ids.to(logits.device)).logits[0]
    assert (logits - ref).abs().max().item() <= atol("logits")
