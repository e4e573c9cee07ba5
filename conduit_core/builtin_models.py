"""Tiny random models of each supported family, built from small configs with a fixed seed.

Public API:
  BUILDERS: dict[str, Callable[[], tuple[PreTrainedModel, ProcessorMixin]]]
      keyed by builtin name without the "builtin:" scheme, e.g. "tiny-qwen2-vl".
  QWEN_SPECIAL_TOKENS, CHATML_TEMPLATE
Weights are a pure function of the seed and config; `builtin.py` materialises them once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    PreTrainedModel,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from conduit_core.processors import ImageOnlyQwen2VLProcessor
from conduit_core.tiny_tokenizer import build_tokenizer

SEED = 1234
QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                       "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# ChatML; images rendered by `image_markup` (a family's single image placeholder).
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}IMAGE_MARKUP"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_template(image_markup: str) -> str:
    """The builtin chat template with `image_markup` as each image's placeholder."""
    return _CHATML.replace("IMAGE_MARKUP", image_markup)


def _text_config(tok: Any, vocab: int) -> dict[str, Any]:
    """A tiny Qwen2 language model: hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16."""
    return dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, initializer_range=0.1,
        bos_token_id=_tid(tok, "<|endoftext|>"),
        eos_token_id=_tid(tok, "<|im_end|>"),
        pad_token_id=_tid(tok, "<|endoftext|>"),
    )


def _tid(tok: Any, token: str) -> int:
    """The id of one token (which must be in the vocabulary)."""
    return int(tok.convert_tokens_to_ids(token))


def _vocab(tok: Any) -> int:
    return (len(tok) + 63) // 64 * 64


def _seeded(build: Callable[[], PreTrainedModel]) -> PreTrainedModel:
    torch.manual_seed(SEED)
    model = build()
    return model.eval()


def tiny_qwen2_vl() -> tuple[PreTrainedModel, Any]:
    """Qwen2-VL: M-RoPE sections (2, 3, 3) over head_dim 16, vision depth 2, embed 32."""
    tok = build_tokenizer(QWEN_SPECIAL_TOKENS,
                          chat_template=chatml_template(
                              "<|vision_start|><|image_pad|><|vision_end|>"),
                          eos_token="<|im_end|>", pad_token="<|endoftext|>")
    text = _text_config(tok, _vocab(tok))
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                               "mrope_section": [2, 3, 3]}
    cfg = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           initializer_range=0.1),
        image_token_id=_tid(tok, "<|image_pad|>"),
        video_token_id=_tid(tok, "<|video_pad|>"),
        vision_start_token_id=_tid(tok, "<|vision_start|>"),
        vision_end_token_id=_tid(tok, "<|vision_end|>"),
    )
    model = _seeded(lambda: Qwen2VLForConditionalGeneration(cfg))
    ip = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
    return model, ImageOnlyQwen2VLProcessor(image_processor=ip, tokenizer=tok,
                                            chat_template=tok.chat_template)


BUILDERS: dict[str, Callable[[], tuple[PreTrainedModel, Any]]] = {
    "tiny-qwen2-vl": tiny_qwen2_vl,
}
