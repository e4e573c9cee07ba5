"""The walking skeleton: builtin tiny Qwen2-VL loads, and full prefill matches transformers."""

from __future__ import annotations

from pathlib import Path

import torch

from conduit_core import ReuseRuntime
from tests.core.conftest import load_builtin, page_image


def test_tiny_qwen2_vl_full_prefill_matches_model(model_cache: Path) -> None:
    vlm = load_builtin("builtin:tiny-qwen2-vl", model_cache)
    rt = ReuseRuntime(vlm)
    pages = [("Page 1:\n", page_image(1)), ("Page 2:\n", page_image(2, (300, 200)))]
    asm = rt.assemble_fresh("You answer questions.", pages, "What is the total?")
    logits = rt.logits(rt.prefill(asm, asm.layout.visual_rows()))  # (N, vocab)
    prepared = vlm.adapter.prepare_pages([img for _, img in pages])
    kwargs = vlm.adapter.reference_inputs(asm.layout.token_ids, prepared)
    with torch.no_grad():
        ref = vlm.model(**kwargs).logits[0]  # (N, vocab)
    assert (logits - ref).abs().max().item() <= 1e-4
    result = rt.answer_full_prefill("You answer questions.", pages, "What is the total?",
                                    max_new_tokens=6)
    gen = vlm.model.generate(**kwargs, max_new_tokens=6, do_sample=False)[0, asm.layout.n:]
    stops = set(vlm.adapter.stop_token_ids())
    expected = []
    for t in gen.tolist():
        if t in stops:
            break
        expected.append(t)
    assert result.token_ids == expected
    assert result.ttft_s > 0 and result.flops_ratio == 1.0


def test_builtin_load_is_deterministic(model_cache: Path, tmp_path: Path) -> None:
    from conduit_core import load_vlm

    a = load_builtin("builtin:tiny-qwen2-vl", model_cache)
    b = load_vlm("builtin:tiny-qwen2-vl", cache_dir=tmp_path)  # built afresh elsewhere
    assert a.fingerprint == b.fingerprint
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items(),
                                  strict=True):
        assert ka == kb and torch.equal(va, vb)
