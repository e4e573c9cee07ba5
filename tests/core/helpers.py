"""Test helpers: deterministic page images and independent reference computations that use
the transformers model directly (never the runtime's own layer loop), and two references of
the product's batched computations: `rerotate` (one page by one shift, layer by layer: what
`rotation.rerotate_into` must write element for element) and `token_scores` (the scoring
reduction over all layers at once: what `scoring.ScoreAccumulator` must give)."""

from __future__ import annotations

import sys
from typing import Any

import torch
from PIL import Image

from conduit_core.answer_types import AnswerResult
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.prompt.rotation import shift_cos_sin, span_deltas
from conduit_core.runtime import ReuseRuntime
from lab import answering


def page_image(seed: int, size: tuple[int, int] = (224, 280)) -> Image.Image:
    """A deterministic noisy page image of `size` (width, height)."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


IMAGES = {"a": page_image(1), "b": page_image(2, (300, 200)), "c": page_image(3, (180, 360))}


def own_flops(result: AnswerResult) -> float:
    """The LM FLOPs of an answer's own path (`flops_used_lm` less what it computed for the
    head and label caches): what the cost model predicts and the fallback guard bounds, the
    same on cold and warm caches."""
    return result.flops_used_lm - result.fill_flops_lm


def reference_logits(vlm: LoadedVLM, asm: Assembly, images: list[Image.Image]) -> torch.Tensor:
    """The transformers model's own forward logits (N, vocab) for an assembly's layout."""
    prepared = vlm.adapter.prepare_pages(images)
    kwargs = vlm.adapter.reference_inputs(asm.layout.token_ids, prepared)
    with torch.no_grad():
        logits: torch.Tensor = vlm.model(**kwargs).logits[0].float()
    return logits


def reference_hidden_states(vlm: LoadedVLM, token_ids: torch.Tensor,
                            images: list[Image.Image]) -> tuple[torch.Tensor, ...]:
    """Inputs of every decoder layer (L entries of (N, hidden)) from the model's own forward."""
    prepared = vlm.adapter.prepare_pages(images)
    kwargs = vlm.adapter.reference_inputs(token_ids, prepared)
    with torch.no_grad():
        out = vlm.model(**kwargs, output_hidden_states=True)
    n_layers = len(vlm.adapter.layers)
    return tuple(h[0] for h in out.hidden_states[:n_layers])


def direct_keys(vlm: LoadedVLM, layer_inputs: tuple[torch.Tensor, ...], rows: slice,
                new_positions: torch.Tensor) -> torch.Tensor:
    """Keys (L, kv, T, hd) of tokens `rows` computed from their layer inputs with the model's
    own norm, k_proj, rotary embedding and apply_rotary_pos_emb at `new_positions` (P, T)."""
    lm = vlm.adapter.language_model
    out = []
    for layer, h in zip(vlm.adapter.layers, layer_inputs, strict=True):
        attn = layer.self_attn
        x = layer.input_layernorm(h[rows]).unsqueeze(0)  # (1, T, hidden)
        with torch.no_grad():
            k = attn.k_proj(x).view(1, x.shape[1], -1, attn.head_dim).transpose(1, 2)
            pos = new_positions.to(k.device).unsqueeze(1)  # (P, 1, T)
            cos, sin = lm.rotary_emb(k, pos if pos.shape[0] == 3 else pos[0])
            apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
            _, k_rot = apply(k, k, cos, sin)
        out.append(k_rot[0])  # (kv, T, hd)
    return torch.stack(out)


def page_from_assembly(rt: ReuseRuntime, asm: Assembly, page: int) -> PageKV:
    """A PageKV cut out of a fully prefilled assembly (the page as it sits in that layout)."""
    seg = asm.layout.segments[page]
    sl = slice(seg.start, seg.stop)
    return PageKV(
        embeds=asm.embeds[sl].clone(), keys=asm.cache.keys[:, 0, :, sl].clone(),
        values=asm.cache.values[:, 0, :, sl].clone(),
        position_ids=asm.layout.position_ids[:, sl].clone(),
        token_ids=asm.layout.token_ids[sl].clone(), image_grid=asm.image_grids[page].clone(),
        fingerprint=rt.vlm.fingerprint)


def until_stop(tokens: list[int], stops: list[int]) -> list[int]:
    """Tokens before the first stop token."""
    out = []
    for t in tokens:
        if t in stops:
            break
        out.append(t)
    return out


def full_logits(rt: ReuseRuntime, prefix: str, pages: list[tuple[str, Image.Image]],
                question: str) -> tuple[Assembly, torch.Tensor]:
    """Full prefill (vision tower now) of a layout through the runtime: assembly, logits."""
    asm = answering.assemble_fresh(rt, prefix, pages, question)
    logits = rt.reuse.logits(answering.prefill(rt, asm, asm.layout.visual_rows()))
    return asm, logits


def kwargs_of(obj: Any) -> dict[str, Any]:
    """Public attributes of a dataclass-like object (for readable assertion messages)."""
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def rerotate(adapter: VLMAdapter, keys: torch.Tensor, delta: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """RoPE'd keys (L, kv, T, hd), or any (..., T, hd), turned by `delta` positions with
    float32 math, one layer at a time, into `out` (same shape, any float dtype and strides)
    or a new tensor; returned."""
    if out is None:
        out = torch.empty_like(keys)
    if delta == 0:
        return out.copy_(keys)
    cos, sin = shift_cos_sin(adapter, delta, keys.device)  # (hd,) each
    half = keys.shape[-1] // 2
    pairs = zip(keys, out, strict=True) if keys.dim() == 4 else iter([(keys, out)])
    for src, dst in pairs:  # (kv, T, hd): one decoder layer at a time
        k = src.float()  # (..., T, hd)
        rotated = k * cos  # (..., T, hd)
        rotated[..., :half].addcmul_(k[..., half:], sin[:half], value=-1.0)
        rotated[..., half:].addcmul_(k[..., :half], sin[half:])
        dst.copy_(rotated)
    return out


def token_scores(
    probs: torch.Tensor,
    value_norms: torch.Tensor,
    config: ScoreConfig,
    *,
    attention: bool = True,
    value_norm: bool = True,
    n_prompt: int = 0,
) -> torch.Tensor:
    """Score every key token: (N,) float32.

    probs (L, H, Q, N) question-row attention probabilities; value_norms (L, G, N).
    `attention=False` scores by value norm alone, `value_norm=False` by attention alone;
    `n_prompt`: the generation prompt's rows, last among the Q (for `query_rows`).
    """
    n_layers, heads, n_q, _ = probs.shape
    kv_heads = value_norms.shape[1]
    sl = config.layer_slice(n_layers)
    p = probs[sl].float()  # (L', H, Q, N)
    p = p[:, :, config.scored_rows(n_q, n_prompt).to(p.device)]  # (L', H, Q', N)
    if not attention:
        p = torch.ones_like(p[:, :, :1])  # (L', H, 1, N): the norm alone
    if value_norm:
        vn = value_norms[sl].float()  # (L', G, N)
        if config.value_norm == "layer":
            vn = vn / vn.mean(dim=-1, keepdim=True).clamp_min(1e-12)
        vn = vn.repeat_interleave(heads // kv_heads, dim=1)  # (L', H, N)
        p = p * vn.unsqueeze(2)  # (L', H, Q, N)
    per_head = p.mean(dim=1) if config.head_agg == "mean" else p.amax(dim=1)  # (L', Q, N)
    return per_head.mean(dim=(0, 1))  # (N,)


def segment_delta(old_positions: torch.Tensor, new_positions: torch.Tensor) -> int:
    """The shift of one span, (P, T) positions each (`span_deltas` of a single span)."""
    return span_deltas(old_positions.cpu(), new_positions.cpu(), [old_positions.shape[-1]])[0]
