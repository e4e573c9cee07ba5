"""The shared layer loop covers Qwen3 language models (per-head q/k norms) exactly, and
refuses decoder stacks it would not reproduce (other LM types, sliding-window layers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import InternVLConfig, InternVLForConditionalGeneration

from conduit_core import ReuseRuntime, load_vlm
from conduit_core.errors import UnsupportedModelError
from conduit_core.model.builtin_models import tiny_internvl
from lab import answering
from tests.core.helpers import IMAGES, reference_logits


def _save_internvl(folder: Path, **text_overrides: Any) -> Path:
    base, processor = tiny_internvl()
    cfg = base.config.to_dict()
    text = dict(cfg["text_config"], **text_overrides)
    config = InternVLConfig(**{**cfg, "text_config": text})
    torch.manual_seed(0)
    InternVLForConditionalGeneration(config).eval().save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def test_qwen3_language_model_full_prefill_is_exact(tmp_path: Path) -> None:
    folder = _save_internvl(tmp_path / "internvl-qwen3", model_type="qwen3", head_dim=16,
                            architectures=None)
    vlm = load_vlm(str(folder), cache_dir=tmp_path, max_image_tokens=16)
    assert vlm.model.config.text_config.model_type == "qwen3"
    assert vlm.adapter.layers[0].self_attn.q_norm is not None
    rt = ReuseRuntime(vlm)
    pages = [("Page 1:\n", IMAGES["a"]), ("Page 2:\n", IMAGES["b"])]
    asm = answering.assemble_fresh(rt, "Be brief.", pages, "What is the total?")
    logits = rt.reuse.logits(answering.prefill(rt, asm, asm.layout.visual_rows()))
    ref = reference_logits(vlm, asm, [img for _, img in pages])
    assert (logits - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("overrides, match", [
    ({"model_type": "llama"}, "language model type 'llama'"),
    ({"use_sliding_window": True, "sliding_window": 8,
      "layer_types": ["sliding_attention"] * 4},
     "sliding-window"),
])
def test_unreproducible_language_models_are_refused(tmp_path: Path, overrides: dict[str, Any],
                                                    match: str) -> None:
    folder = _save_internvl(tmp_path / "internvl-other", **overrides)
    with pytest.raises(UnsupportedModelError, match=match):
        load_vlm(str(folder), cache_dir=tmp_path)
