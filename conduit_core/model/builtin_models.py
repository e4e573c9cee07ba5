"""Tiny random models of each supported family, built from small configs with a fixed seed.

Weights are a pure function of the seed and the config, so a builtin is the same model on
every machine (`builtin.py` materialises it once). The tiny models of the four families share
one tiny Qwen2 language model and a locally trained byte-level BPE tokenizer with a ChatML
template; they keep the tests fast. `small-qwen2-vl`, the service's default, is sized so
that a page is at least as many visual tokens as a real checkpoint's and compute, not
per-layer overhead, dominates a prefill on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    PreTrainedModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from conduit_core.model.processors import (
    ImageOnlyInternVLProcessor,
    ImageOnlyLlavaOnevisionProcessor,
    ImageOnlyQwen2_5_VLProcessor,
    ImageOnlyQwen2VLProcessor,
)
from conduit_core.model.tiny_tokenizer import build_tokenizer

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
    """A tiny Qwen2 language model: hidden 64, 4 layers, 4 heads, 2 KV heads, head_dim 16."""
    return dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, initializer_range=0.1, **chatml_text_ids(tok),
    )


def chatml_text_ids(tok: Any) -> dict[str, Any]:
    """The builtin tokenizer's bos/eos/pad ids, as a language model config takes them."""
    return {"bos_token_id": _tid(tok, "<|endoftext|>"), "eos_token_id": _tid(tok, "<|im_end|>"),
            "pad_token_id": _tid(tok, "<|endoftext|>")}


def qwen_vision_ids(tok: Any) -> dict[str, Any]:
    """The image, video and vision start/end token ids, as a Qwen2(.5)-VL config takes them."""
    return {"image_token_id": _tid(tok, "<|image_pad|>"),
            "video_token_id": _tid(tok, "<|video_pad|>"),
            "vision_start_token_id": _tid(tok, "<|vision_start|>"),
            "vision_end_token_id": _tid(tok, "<|vision_end|>")}


def _tid(tok: Any, token: str) -> int:
    """The id of one token (which must be in the vocabulary)."""
    return int(tok.convert_tokens_to_ids(token))


def _vocab(tok: Any) -> int:
    return (len(tok) + 63) // 64 * 64


def _seeded(build: Callable[[], PreTrainedModel]) -> PreTrainedModel:
    torch.manual_seed(SEED)
    model = build()
    return model.eval()


def _qwen2_vl(tok: Any, text: dict[str, Any], mrope: list[int], rope_theta: float,
              vision: dict[str, Any], max_page_tokens: int) -> tuple[PreTrainedModel, Any]:
    """A seeded Qwen2-VL from a text config, its M-RoPE sections, a vision tower's sizes and
    the most merged visual tokens (28-pixel cells) a page may have."""
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta,
                               "mrope_section": mrope}
    cfg = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(**vision, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2),
        **qwen_vision_ids(tok),
    )
    model = _seeded(lambda: Qwen2VLForConditionalGeneration(cfg))
    ip = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=max_page_tokens * 28 * 28)
    return model, ImageOnlyQwen2VLProcessor(image_processor=ip, tokenizer=tok,
                                            chat_template=tok.chat_template)


def tiny_qwen2_vl() -> tuple[PreTrainedModel, Any]:
    """Qwen2-VL: M-RoPE sections (2, 3, 3) over head_dim 16, vision depth 2, embed 32."""
    tok = _qwen_tokenizer()
    return _qwen2_vl(tok, _text_config(tok, _vocab(tok)), [2, 3, 3], 10000.0,
                     dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2,
                          initializer_range=0.1), max_page_tokens=64)


SMALL_PAGE_TOKENS = 512  # merged visual tokens per page at most: an A4 page at 100 dpi is ~500


def small_qwen2_vl() -> tuple[PreTrainedModel, Any]:
    """The default builtin: Qwen2-VL with a language model of hidden 512, 8 layers, 8 heads
    of 64 (2 KV heads), MLP 1536, M-RoPE sections (8, 12, 12); a vision tower of depth 4 and
    width 128; pages up to 512 merged visual tokens (28-pixel cells). Random weights: its
    answers mean nothing, its costs and speed are those of a model of this shape."""
    tok = _qwen_tokenizer()
    text = dict(vocab_size=_vocab(tok), hidden_size=512, intermediate_size=1536,
                num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                max_position_embeddings=32768, rms_norm_eps=1e-6, initializer_range=0.02,
                **chatml_text_ids(tok))
    return _qwen2_vl(tok, text, [8, 12, 12], 1_000_000.0,
                     dict(depth=4, embed_dim=128, hidden_size=512, num_heads=4,
                          initializer_range=0.02), max_page_tokens=SMALL_PAGE_TOKENS)


def _qwen_tokenizer() -> Any:
    return build_tokenizer(QWEN_SPECIAL_TOKENS,
                           chat_template=chatml_template(
                               "<|vision_start|><|image_pad|><|vision_end|>"),
                           eos_token="<|im_end|>", pad_token="<|endoftext|>")


def tiny_qwen2_5_vl() -> tuple[PreTrainedModel, Any]:
    """Qwen2.5-VL: windowed vision attention (window 2x2 merged tokens, block 1 full)."""
    tok = _qwen_tokenizer()
    text = _text_config(tok, _vocab(tok))
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                               "mrope_section": [2, 3, 3]}
    cfg = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1],
                           initializer_range=0.1),
        **qwen_vision_ids(tok),
    )
    model = _seeded(lambda: Qwen2_5_VLForConditionalGeneration(cfg))
    ip = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)
    return model, ImageOnlyQwen2_5_VLProcessor(image_processor=ip, tokenizer=tok,
                                               chat_template=tok.chat_template)


_LLAVA_TILE = 28  # SigLIP tile side: 2 x 2 patches of 14 -> 4 tokens per tile
_LLAVA_PINPOINTS = [[_LLAVA_TILE * a, _LLAVA_TILE * b] for a in (1, 2, 3) for b in (1, 2, 3)]


def tiny_llava_onevision() -> tuple[PreTrainedModel, Any]:
    """LLaVA-OneVision: tiny SigLIP tower (28 px tiles), anyres up to 3 x 3 tiles."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
    tok = build_tokenizer(specials, chat_template=chatml_template("<image>\n"),
                          eos_token="<|im_end|>", pad_token="<|endoftext|>",
                          named_special={"image_token": "<image>", "video_token": "<video>"})
    cfg = LlavaOnevisionConfig(
        text_config=dict(model_type="qwen2", **_text_config(tok, _vocab(tok))),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32,
                           intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=_LLAVA_TILE, patch_size=14, vision_use_head=False),
        image_token_index=_tid(tok, "<image>"), video_token_index=_tid(tok, "<video>"),
        image_grid_pinpoints=_LLAVA_PINPOINTS, vision_aspect_ratio="anyres_max_9",
        vision_feature_select_strategy="full", vision_feature_layer=-1,
    )
    model = _seeded(lambda: LlavaOnevisionForConditionalGeneration(cfg))
    ip = LlavaOnevisionImageProcessorPil(size={"height": _LLAVA_TILE, "width": _LLAVA_TILE},
                                         image_grid_pinpoints=_LLAVA_PINPOINTS)
    proc = ImageOnlyLlavaOnevisionProcessor(
        image_processor=ip, tokenizer=tok, chat_template=tok.chat_template,
        num_image_tokens=(_LLAVA_TILE // 14) ** 2, vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9")
    return model, proc


def tiny_internvl() -> tuple[PreTrainedModel, Any]:
    """InternVL (native transformers class): 56 px tiles, pixel shuffle 0.5 -> 4 tokens per
    tile, up to 4 tiles plus a thumbnail."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>",
                "<IMG_CONTEXT>", "<video>"]
    tok = build_tokenizer(specials, chat_template=chatml_template("<IMG_CONTEXT>\n"),
                          eos_token="<|im_end|>", pad_token="<|endoftext|>",
                          named_special={"start_image_token": "<img>",
                                         "end_image_token": "</img>",
                                         "context_image_token": "<IMG_CONTEXT>",
                                         "video_token": "<video>"})
    cfg = InternVLConfig(
        text_config=dict(model_type="qwen2", **_text_config(tok, _vocab(tok))),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=[56, 56], patch_size=[14, 14],
                           initializer_range=0.1),
        image_token_id=_tid(tok, "<IMG_CONTEXT>"), image_seq_length=4, downsample_ratio=0.5,
        vision_feature_select_strategy="default", vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    model = _seeded(lambda: InternVLForConditionalGeneration(cfg))
    ip = GotOcr2ImageProcessorPil(size={"height": 56, "width": 56}, crop_to_patches=True,
                                  min_patches=1, max_patches=4)
    proc = ImageOnlyInternVLProcessor(image_processor=ip, tokenizer=tok,
                                      chat_template=tok.chat_template, image_seq_length=4)
    return model, proc


BUILDERS: dict[str, Callable[[], tuple[PreTrainedModel, Any]]] = {
    "small-qwen2-vl": small_qwen2_vl,
    "tiny-qwen2-vl": tiny_qwen2_vl,
    "tiny-qwen2.5-vl": tiny_qwen2_5_vl,
    "tiny-llava-onevision": tiny_llava_onevision,
    "tiny-internvl": tiny_internvl,
}
