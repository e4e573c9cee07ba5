"""The model-family seam: what the shared runtime needs to know about one VLM family.

A family subclass of `VLMAdapter` supplies only what differs between families: a page's
segment layout and image tokens (`prepare_pages`), the segment's layer-0 input embeddings
(`page_embeds`), position ids for any layout (`position_ids`) and the reference forward inputs
the tests compare against (`reference_inputs`). The base class gives access to the decoder
layers, rotary embedding and chat template, and runs a layer's projections, fused once loaded
(`adapters.fused`). Everything else (layer loop, masks, cache writes, rotation, decode) is
shared runtime code.

It decides what the runtime can reproduce exactly, and refuses the rest with
`UnsupportedModelError`: language models outside `SUPPORTED_TEXT_MODELS`, RoPE types whose
frequencies depend on the sequence length (a cached key could not be re-rotated), and
attention implementations other than sdpa and eager.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from PIL import Image
from torch import nn

from conduit_core.errors import UnsupportedModelError
from conduit_core.model import flops
from conduit_core.model.adapters.fused import fuse_layers, fused_of

# prompt pieces (template, prefixes, page labels, short questions) kept tokenized, and the
# longest piece kept: at most about a megabyte of text and ids
TOKENIZED_PIECES = 4096
TOKENIZED_PIECE_CHARS = 256

# decoder stacks with the Qwen2 layer structure (pre-norm attention + gated MLP, rotate-half
# RoPE); Qwen3 adds per-head q/k norms, which `VLMAdapter.qkv` applies
SUPPORTED_TEXT_MODELS = frozenset({"qwen2", "qwen3", "qwen2_vl_text", "qwen2_5_vl_text"})

# Re-rotating a cached key by a position shift (R(p + d) = R(d) R(p)) is exact only when the
# rotary frequencies are fixed: default, linear (positions scaled), llama3 and yarn
# (frequencies remapped once, from the config) and mrope qualify; `dynamic` NTK and
# `longrope` recompute them from the sequence length, so a page's cached keys would have been
# rotated with other frequencies than the request's.
SHIFT_EXACT_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn", "mrope"})


# The runtime runs row subsets with exact causal masks: additive float masks under `eager`,
# blocked calls with per-block masks under `sdpa`. Other implementations (flash_attention_2,
# flex_attention, paged variants) would get a dense 4-D additive mask that they ignore or
# reject: the masked refresh would break or go silently wrong.
SUPPORTED_ATTENTION = ("sdpa", "eager")


def check_attention(impl: str | None, family: str) -> None:
    """Refuse an attention implementation the runtime does not drive exactly."""
    if (impl or "sdpa") not in SUPPORTED_ATTENTION:
        raise UnsupportedModelError(
            f"{family}: attn_implementation {impl!r} is not supported: the runtime runs row "
            "subsets of the prompt under exact causal masks, which it drives for "
            f"{' and '.join(SUPPORTED_ATTENTION)} only (use attn_implementation='sdpa')")


def _rope_settings(cfg: Any) -> list[tuple[str, dict[str, Any]]]:
    """(setting name, parameters) of a text config's RoPE: `rope_parameters` (transformers
    5, possibly one dict per layer type) or the older `rope_scaling`."""
    for attr in ("rope_parameters", "rope_scaling"):
        params = getattr(cfg, attr, None)
        if not params:
            continue
        if all(isinstance(v, dict) for v in params.values()):  # per layer type
            return [(f"{attr}[{k!r}]", dict(v)) for k, v in params.items()]
        return [(attr, dict(params))]
    return []


def check_rope(cfg: Any, family: str) -> None:
    """Refuse a language model whose RoPE frequencies depend on the sequence length."""
    for setting, params in _rope_settings(cfg):
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type not in SHIFT_EXACT_ROPE_TYPES:
            raise UnsupportedModelError(
                f"{family}: {setting} rope_type {rope_type!r} is not supported: cached page "
                "keys are re-rotated by a position shift, which is exact only for rotary "
                "frequencies that do not depend on the sequence length (supported: "
                f"{', '.join(sorted(SHIFT_EXACT_ROPE_TYPES))})")


@dataclass
class PreparedPage:
    """A page image turned into a model segment (before any forward)."""

    token_ids: torch.Tensor  # (T,) int64, the whole segment including its delimiters
    image_grid: torch.Tensor  # (3,) int64, family-specific (t, h, w) grid
    vision_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # processor tensors


class VLMAdapter(ABC):
    """Family-specific glue around a transformers VLM; see the module docstring."""

    family: ClassVar[str]
    template_version: ClassVar[str] = "chatml-v1"
    rope_axes: ClassVar[int] = 1  # 3 for M-RoPE families

    def __init__(self, model: nn.Module, processor: Any, tokenizer: Any, max_image_tokens: int):
        self.model: Any = model  # a transformers *ForConditionalGeneration
        self.processor = processor
        self.tokenizer = tokenizer
        self.max_image_tokens = max_image_tokens
        # template pieces, page labels and prefixes recur in every prompt: tokenized once
        self._encode = functools.lru_cache(maxsize=TOKENIZED_PIECES)(self._tokenize)
        self._check_language_model()

    def _check_language_model(self) -> None:
        """Refuse decoder stacks the shared layer loop does not reproduce exactly."""
        cfg = self.text_config
        if cfg.model_type not in SUPPORTED_TEXT_MODELS:
            raise UnsupportedModelError(
                f"{self.family}: language model type {cfg.model_type!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED_TEXT_MODELS))})")
        if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
            raise UnsupportedModelError(
                f"{self.family}: sliding-window attention layers are not supported")
        check_rope(cfg, self.family)
        check_attention(self.attn_implementation, self.family)

    # ---- structure -------------------------------------------------------------------
    @property
    def language_model(self) -> Any:
        """The decoder stack (`embed_tokens`, `layers`, `norm`, `rotary_emb`)."""
        return self.model.model.language_model

    @property
    def layers(self) -> Any:
        """Decoder layers in order (an `nn.ModuleList`)."""
        return self.language_model.layers

    @property
    def lm_head(self) -> Any:
        """Output projection to vocabulary logits."""
        return self.model.lm_head

    @property
    def attn_implementation(self) -> str:
        """The language model's attention implementation ("sdpa" or "eager")."""
        impl = self.model.config._attn_implementation or "sdpa"
        return str(impl)

    @property
    def text_config(self) -> Any:
        """The language model's config."""
        return self.model.config.get_text_config()

    @property
    def device(self) -> torch.device:
        """Device of the language model weights."""
        device: torch.device = self.language_model.embed_tokens.weight.device
        return device

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype of the language model."""
        dtype: torch.dtype = self.language_model.embed_tokens.weight.dtype
        return dtype

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Layer-0 text embeddings: (..., T) -> (..., T, hidden)."""
        emb: torch.Tensor = self.language_model.embed_tokens(token_ids.to(self.device))
        return emb

    def fuse_projections(self) -> int:
        """Fuse every layer's q/k/v and gate/up projections into one weight each, the
        modules' parameters becoming views of it (`conduit_core.model.adapters.fused`; call
        once the model is placed and cast); returns the groups fused."""
        return fuse_layers(self.layers)

    def qkv(self, attn: Any, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Pre-RoPE q, k, v of normed hidden states `h` (B, R, hidden): one matmul where the
        projections are fused, else the module's own three; q (B, heads, R, hd), k and v
        (B, kv_heads, R, hd) (views of the projection's output)."""
        b, r, _ = h.shape
        hd = attn.head_dim
        fused = fused_of(attn)
        q, k, v = (fused.split(h) if fused is not None
                   else (attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)))  # (B, R, out_i)
        q = q.view(b, r, -1, hd)  # (B, R, heads, hd)
        k = k.view(b, r, -1, hd)  # (B, R, kv_heads, hd)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3 language models: per-head norms
            q, k = attn.q_norm(q), attn.k_norm(k)
        v = v.view(b, r, -1, hd).transpose(1, 2)  # (B, kv_heads, R, hd)
        return q.transpose(1, 2), k.transpose(1, 2), v

    @staticmethod
    def mlp(mlp: Any, h: torch.Tensor) -> torch.Tensor:
        """The gated MLP `mlp` of normed hidden states `h` (B, R, hidden): gate and up in one
        matmul where fused, else the module's own forward; (B, R, hidden)."""
        fused = fused_of(mlp)
        if fused is None:
            out: torch.Tensor = mlp(h)
            return out
        gate, up = fused.split(h)  # (B, R, intermediate) each
        down: torch.Tensor = mlp.down_proj(mlp.act_fn(gate) * up)  # (B, R, hidden)
        return down

    def rotary(self, like: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """cos, sin (B, R, hd) from the model's own rotary embedding; position_ids (P, B, R)."""
        pos = position_ids if self.rope_axes == 3 else position_ids[0]
        cos, sin = self.language_model.rotary_emb(like, pos)
        return cos, sin

    @staticmethod
    def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x (B, heads, R, hd) by cos/sin (B, R, hd), the rotate-half RoPE convention
        shared by every supported family (Qwen2 language models)."""
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, R, hd)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (B, heads, R, hd)
        return x * cos + rotated * sin

    # ---- chat template ---------------------------------------------------------------
    def _tokenize(self, text: str, user: bool) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False,
                                    split_special_tokens=user).input_ids)

    def _ids(self, text: str, *, user: bool = False) -> list[int]:
        if len(text) > TOKENIZED_PIECE_CHARS:
            return list(self._tokenize(text, user))
        return list(self._encode(text, user))

    def page_opening_ids(self) -> list[int]:
        """Tokens before the segment in the canonical page context."""
        return self._ids("<|im_start|>user\n")

    def head_ids(self, prefix: str) -> list[int]:
        """Tokens of the assembled prompt before the first page (system prefix + user turn).
        With an empty prefix this equals `page_opening_ids()`."""
        if not prefix:
            return self.page_opening_ids()
        return (self._ids("<|im_start|>system\n") + self._ids(prefix, user=True)
                + self._ids("<|im_end|>\n") + self.page_opening_ids())

    def label_ids(self, label: str) -> list[int]:
        """Tokens of the text placed before a page segment."""
        return self._ids(label, user=True) if label else []

    def tail_ids(self, question: str) -> list[int]:
        """The question and the generation prompt."""
        return (self._ids(question, user=True) + self._ids("<|im_end|>\n")
                + self._ids("<|im_start|>assistant\n"))

    def answer_ids(self, answer: str) -> list[int]:
        """An answer as a conversation holds it: its text as user text (a special token's
        spelling stays text) and the end of the assistant's turn."""
        return self._ids(answer, user=True) + self._ids("<|im_end|>\n")

    def stop_token_ids(self) -> list[int]:
        """Token ids that end generation."""
        ids = {self.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
        eos = self.model.generation_config.eos_token_id
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        unk = self.tokenizer.unk_token_id
        return sorted(i for i in ids if i is not None and i != unk)

    def vision_parameters(self) -> int:
        """Parameters outside the language model and head (vision tower + projector)."""
        lm = {id(p) for p in self.language_model.parameters()}
        lm |= {id(p) for p in self.lm_head.parameters()}
        return sum(p.numel() for p in self.model.parameters() if id(p) not in lm)

    def vision_flops(self, image_grids: list[torch.Tensor]) -> float:
        """Vision-tower FLOPs of encoding these pages: the analytic model of
        `conduit_core.model.flops` where it knows the family, else 2 * vision parameters * tokens
        entering the tower."""
        try:
            return float(flops.vision_flops(self, image_grids))
        except UnsupportedModelError:
            tokens = sum(self.vision_tokens(g) for g in image_grids)
            return 2.0 * self.vision_parameters() * tokens

    # ---- family specific -------------------------------------------------------------
    @abstractmethod
    def vision_tokens(self, image_grid: torch.Tensor) -> int:
        """Tokens entering the vision tower for a page with this grid (for FLOPs)."""

    @abstractmethod
    def prepare_pages(self, images: list[Image.Image]) -> list[PreparedPage]:
        """Run the image processor; return each page's segment token ids and vision inputs."""

    @abstractmethod
    def page_embeds(self, pages: list[PreparedPage]) -> list[torch.Tensor]:
        """Layer-0 input embeddings of each page segment, (T_i, hidden): text embeddings for
        delimiter tokens, vision tower + projector output at the image tokens. Batched."""

    @abstractmethod
    def position_ids(self, token_ids: torch.Tensor,
                     image_grids: list[torch.Tensor]) -> torch.Tensor:
        """Position ids (P, N) of a whole layout by the family's own rule; `image_grids` are
        the grids of the image segments in `token_ids`, in order."""

    @abstractmethod
    def reference_inputs(self, token_ids: torch.Tensor,
                         pages: list[PreparedPage]) -> dict[str, Any]:
        """Keyword arguments for the transformers model's own forward/generate on the same
        layout (batch of one): used to check the runtime against the model."""
