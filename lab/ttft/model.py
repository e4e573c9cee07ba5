"""The TTFT benchmark's model and workload: a random-weight Qwen2.5-VL of a chosen shape.

The model is built with the real transformers classes from a config (no download), random
weights from a fixed seed, the builtin ChatML byte-level tokenizer and the stock Qwen2-VL
image processor (PIL), wrapped as a `LoadedVLM` so that `ReuseRuntime` drives it exactly as
it drives a checkpoint. Shapes (`SHAPES`):
  "tiny"  hidden 64, 2 layers (tests)
  "cpu"   hidden 512, 8 layers, 8 heads / 2 KV heads, d_ff 2752; vision tower hidden 256,
          depth 6 (two full-attention blocks): the default CPU workload. Its ratios follow
          Qwen2.5-VL-7B: d_ff / d = 5.4 (7B: 5.3); vision-tower FLOPs per visual token over
          language-model linear FLOPs per token = 0.45 (7B: 0.39)
  "7b"    Qwen2.5-VL-7B-Instruct's config numbers (hidden 3584, 28 layers, 28/4 heads,
          d_ff 18944, vocab 152064; vision 1280 x 32 blocks, windowed): for GPUs
A page is rendered at exactly `tokens_per_page` merged visual tokens (a grid of 28-pixel
cells), so its segment is those tokens plus the two vision delimiters.

Public API:
  SHAPES: dict[str, ModelShape]
  build_bench_vlm(shape, *, tokens_per_page, device="cpu", dtype=torch.float32, seed=0,
                  spec=None)   spec: a ModelShape not in SHAPES, named `shape`
      -> LoadedVLM
  page_grid(tokens) -> (rows, cols)            merged-token grid of a page, rows <= cols
  bench_pages(n, tokens_per_page) -> list[PIL.Image]
  Workload(prefix, labels, question)           texts of one request;  make_workload(vlm,
      pages, question_tokens) -> Workload     (question padded to exactly that many tokens)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from conduit_core.model.adapters.qwen2_5_vl import Qwen2_5_VLAdapter
from conduit_core.model.builtin_models import QWEN_SPECIAL_TOKENS, chatml_template
from conduit_core.model.loader import LoadedVLM
from conduit_core.model.processors import ImageOnlyQwen2_5_VLProcessor
from conduit_core.model.tiny_tokenizer import build_tokenizer
from conduit_core.page_kv import ModelFingerprint
from lab.fidelity.data import render_page

CELL = 28  # pixels per merged visual token side (patch 14 x merge 2)


@dataclass(frozen=True)
class ModelShape:
    """Language-model and vision-tower sizes of one benchmark model."""

    text: dict[str, Any]
    vision: dict[str, Any]
    vocab: int | None = None  # None: the tokenizer's size rounded up to 64
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


SHAPES: dict[str, ModelShape] = {
    "tiny": ModelShape(
        text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, mrope_section=[2, 3, 3]),
        vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                    window_size=56, fullatt_block_indexes=[1]),
        notes="test size"),
    "cpu": ModelShape(
        text=dict(hidden_size=512, intermediate_size=2752, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=2, mrope_section=[8, 12, 12]),
        vision=dict(depth=6, hidden_size=256, intermediate_size=684, num_heads=4,
                    window_size=112, fullatt_block_indexes=[2, 5]),
        notes="CPU size, 7B ratios"),
    "7b": ModelShape(
        text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                  num_attention_heads=28, num_key_value_heads=4, mrope_section=[16, 24, 24],
                  rope_theta=1000000.0),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                    window_size=112, fullatt_block_indexes=[7, 15, 23, 31]),
        vocab=152064, notes="Qwen2.5-VL-7B-Instruct config numbers"),
}


def _tokenizer() -> Any:
    return build_tokenizer(QWEN_SPECIAL_TOKENS,
                           chat_template=chatml_template(
                               "<|vision_start|><|image_pad|><|vision_end|>"),
                           eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _config(shape: ModelShape, tok: Any) -> Qwen2_5_VLConfig:
    t = dict(shape.text)
    section = t.pop("mrope_section")
    theta = float(t.pop("rope_theta", 10000.0))
    vocab = shape.vocab or (len(tok) + 63) // 64 * 64
    tid = tok.convert_tokens_to_ids
    text = dict(vocab_size=vocab, max_position_embeddings=32768, rms_norm_eps=1e-6,
                bos_token_id=tid("<|endoftext|>"), eos_token_id=tid("<|im_end|>"),
                pad_token_id=tid("<|endoftext|>"),
                rope_parameters={"rope_type": "default", "rope_theta": theta,
                                 "mrope_section": section}, **t)
    vision = dict(out_hidden_size=t["hidden_size"], patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, **shape.vision)
    return Qwen2_5_VLConfig(
        text_config=text, vision_config=vision,
        image_token_id=tid("<|image_pad|>"), video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"))


def build_bench_vlm(shape: str, *, tokens_per_page: int, device: str = "cpu",
                    dtype: torch.dtype = torch.float32, seed: int = 0,
                    spec: ModelShape | None = None) -> LoadedVLM:
    """A random-weight Qwen2.5-VL of `SHAPES[shape]` (or of `spec`, named `shape`) on
    `device` in `dtype` (weights are initialised directly there), pages capped at
    `tokens_per_page` visual tokens."""
    if spec is None and shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {sorted(SHAPES)}")
    tok = _tokenizer()
    config = _config(spec or SHAPES[shape], tok)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            config, dtype=dtype, attn_implementation="sdpa")
    model = model.eval()
    cells = tokens_per_page * CELL * CELL
    ip = Qwen2VLImageProcessorPil(min_pixels=min(4, tokens_per_page) * CELL * CELL,
                                  max_pixels=cells)
    processor = ImageOnlyQwen2_5_VLProcessor(image_processor=ip, tokenizer=tok,
                                             chat_template=tok.chat_template)
    adapter = Qwen2_5_VLAdapter(model, processor, tok, tokens_per_page)
    adapter.fuse_projections()  # as the loader does
    blob = json.dumps(config.to_diff_dict(), sort_keys=True, default=str).encode()
    fingerprint = ModelFingerprint(
        name=f"bench:{shape}", revision=f"random-seed-{seed}", dtype=str(dtype).split(".")[-1],
        config_hash=hashlib.sha256(blob).hexdigest(),
        template_version=f"{adapter.template_version}/max_image_tokens={tokens_per_page}")
    return LoadedVLM(name=f"bench:{shape}", model=model, processor=processor, tokenizer=tok,
                     adapter=adapter, fingerprint=fingerprint, device=torch.device(device),
                     dtype=dtype)


def page_grid(tokens: int) -> tuple[int, int]:
    """(rows, cols) of merged tokens with rows * cols == tokens, as square as possible."""
    if tokens < 1:
        raise ValueError("a page needs at least one visual token")
    rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    return rows, tokens // rows


def bench_pages(n: int, tokens_per_page: int) -> list[Image.Image]:
    """`n` document-like page images sized to exactly `tokens_per_page` visual tokens."""
    rows, cols = page_grid(tokens_per_page)
    return [render_page(1000 + i, size=(cols * CELL, rows * CELL)) for i in range(n)]


@dataclass(frozen=True)
class Workload:
    """The text of one benchmark request."""

    prefix: str
    labels: list[str]
    question: str


_PREFIX = ("You are a careful assistant for an insurance archive. Answer from the scanned "
           "pages only, and cite the page you use.")
_QUESTION = ("What is the total amount due on the invoice, who signed the contract, and on "
             "which page is the table of quarterly expenses for the north region shown?")


def make_workload(vlm: LoadedVLM, pages: int, question_tokens: int) -> Workload:
    """Prefix, one label per page, and a question of exactly `question_tokens` tokens."""
    tok = vlm.tokenizer
    words = (_QUESTION.split() * (question_tokens + 1))
    ids: list[int] = []
    for n in range(1, len(words) + 1):
        ids = tok(" ".join(words[:n]), add_special_tokens=False).input_ids
        if len(ids) >= question_tokens:
            break
    question = tok.decode(ids[:question_tokens])
    if len(tok(question, add_special_tokens=False).input_ids) != question_tokens:
        raise ValueError(f"cannot build a question of {question_tokens} tokens")
    return Workload(prefix=_PREFIX, labels=[f"Page {i + 1}:" for i in range(pages)],
                    question=question)
