"""Diagnostics: how far a reused (stale) cache is from a full prefill of the same layout.

Public API:
  KVError(key_max_abs, value_max_abs, key_rel, value_rel)   each (L,) float32 per layer;
      rel = ||reused - reference||_F / ||reference||_F over the compared tokens
  kv_error(reused, reference, rows) -> KVError
      compare two `KVCache`s (batch item 0) at sequence indices `rows` (e.g. the visual rows)
  reuse_kv_error(runtime, prefix, pages, images, question, visual_rows=None) -> KVError
      the visual tokens' K/V error of reusing `pages` (refreshing `visual_rows`, default none;
      text always fresh) against a full prefill of the same layout from `images`
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from PIL import Image

from conduit_core.answer_types import PageInput
from conduit_core.kv.kv_cache import KVCache
from lab import answering

if TYPE_CHECKING:
    from conduit_core.runtime import ReuseRuntime


@dataclass(frozen=True)
class KVError:
    """Per-layer error of reused K/V against a reference."""

    key_max_abs: torch.Tensor  # (L,)
    value_max_abs: torch.Tensor  # (L,)
    key_rel: torch.Tensor  # (L,)
    value_rel: torch.Tensor  # (L,)


def _errors(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    diff = (a.float() - b.float()).flatten(1)  # (L, kv*T*hd)
    ref = b.float().flatten(1)  # (L, kv*T*hd)
    max_abs = diff.abs().amax(dim=1) if diff.shape[1] else torch.zeros(diff.shape[0])
    rel = diff.norm(dim=1) / ref.norm(dim=1).clamp_min(1e-12)  # (L,)
    return max_abs.cpu(), rel.cpu()


def kv_error(reused: KVCache, reference: KVCache, rows: torch.Tensor) -> KVError:
    """Per-layer max-abs and relative error of `reused` against `reference` at `rows`."""
    idx = rows.to(reused.keys.device)
    k_a = reused.keys[:, 0].index_select(2, idx)  # (L, kv, T, hd)
    k_b = reference.keys[:, 0].index_select(2, idx.to(reference.keys.device))
    v_a = reused.values[:, 0].index_select(2, idx)  # (L, kv, T, hd)
    v_b = reference.values[:, 0].index_select(2, idx.to(reference.values.device))
    k_max, k_rel = _errors(k_a, k_b.to(k_a.device))
    v_max, v_rel = _errors(v_a, v_b.to(v_a.device))
    return KVError(key_max_abs=k_max, value_max_abs=v_max, key_rel=k_rel, value_rel=v_rel)


def reuse_kv_error(runtime: ReuseRuntime, prefix: str, pages: list[PageInput],
                   images: list[Image.Image], question: str,
                   visual_rows: torch.Tensor | None = None) -> KVError:
    """K/V error at the visual tokens of reusing cached pages under `prefix` (refreshing
    `visual_rows`, default none) against a full prefill of the same layout."""
    reused = runtime.reuse.assemble(prefix, pages, question)
    refresh = visual_rows if visual_rows is not None else torch.zeros(0, dtype=torch.long)
    answering.prefill(runtime, reused, refresh)
    reference = answering.assemble_fresh(runtime,
        prefix, [(p.label, img) for p, img in zip(pages, images, strict=True)], question)
    answering.prefill(runtime, reference, reference.layout.visual_rows())
    return kv_error(reused.cache, reference.cache, reused.layout.visual_rows())
