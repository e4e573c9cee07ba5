"""The testbed VLM: a small Qwen2-VL trained in this project (see `lab/testbed/`), and its config.

The stock `Qwen2VLForConditionalGeneration` with a small config and the builtin tokenizer;
trained from scratch on pages of glyph records (`conduit-lab testbed train`) so that stale page
KV costs answers that refreshing the right tokens recovers. The trained weights are loaded
from `conduit_core/weights/testbed-qwen2-vl.safetensors` as `builtin:testbed-qwen2-vl`;
they are committed (the testbed checkpoint is part of the product; no other weights are), and
lab/testbed/NOTES.md gives the training command and the export that produce them. Without
weights the same model is initialised at random from a seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

from conduit_core.errors import ModelLoadError
from conduit_core.model.builtin_models import (
    _qwen_tokenizer,
    _vocab,
    chatml_text_ids,
    qwen_vision_ids,
)
from conduit_core.model.processors import ImageOnlyQwen2VLProcessor

NAME = "testbed-qwen2-vl"
WEIGHTS = Path(__file__).parents[1] / "weights" / f"{NAME}.safetensors"
MAX_IMAGE_TOKENS = 256


def testbed_config(tok: Any) -> Qwen2VLConfig:
    """Hidden 128, 5 layers, 2 heads of head_dim 64 (rope_theta 1e6, M-RoPE 8/12/12), MLP 256,
    tied embeddings; vision tower depth 1, embed 64 (14 px patches, 2 x 2 merge: one 28 px
    glyph cell per token). Wide heads with slow rotations leave most of each head's dimensions
    position-stable over a few hundred tokens, which matching a cell by its glyph needs."""
    text = dict(
        vocab_size=_vocab(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=5,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0,
                         "mrope_section": [8, 12, 12]},
        **chatml_text_ids(tok),
    )
    return Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=1, embed_dim=64, hidden_size=128, num_heads=2, mlp_ratio=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           initializer_range=0.02),
        **qwen_vision_ids(tok),
        tie_word_embeddings=True,
    )


def build_testbed(weights: Path | None = WEIGHTS,
                  seed: int = 0) -> tuple[Qwen2VLForConditionalGeneration, Any]:
    """The testbed model and processor; see the module docstring."""
    tok = _qwen_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(testbed_config(tok))
    if weights is not None:
        if not Path(weights).is_file():
            raise ModelLoadError(f"testbed weights not found at {weights}; train them with "
                                 "`conduit-lab testbed train`")
        state = load_file(str(weights))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if m != "lm_head.weight"]  # tied to the embeddings
        if missing or unexpected:
            raise ModelLoadError(f"testbed weights do not match the config: missing {missing}, "
                                 f"unexpected {unexpected}")
        model.tie_weights()
    ip = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=MAX_IMAGE_TOKENS * 28 * 28)
    processor = ImageOnlyQwen2VLProcessor(image_processor=ip, tokenizer=tok,
                                          chat_template=tok.chat_template)
    return model.eval(), processor
