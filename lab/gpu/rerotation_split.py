"""Where a re-rotation error comes from: the rotation, the vision features, or depth.

`check_rerotation` (lab.gpu.check_parts) compares a page's re-rotated cached keys with keys
computed afresh. This splits such an error, per page, on a random-weight Qwen2.5-VL of a
bench shape (`lab.ttft.model.SHAPES`) whose language model and vision tower may be cut to
fewer layers (the widths, and so the rounding of one layer, stay; the vocabulary is cut to
8,192, which no key depends on):
  vision            cached layer-0 embeddings vs the model's own forward of the image alone
  rotation_runtime  re-rotated layer-0 keys vs keys in float64 from the cached embeddings
  rotation_model    transformers' own path (same embeddings, same positions, the model's
                    dtype) vs the same float64 keys: what the dtype allows
  per_layer         re-rotated keys vs keys computed afresh from the cached embeddings by the
                    language model's own forward, every layer (depth's share)
All are max |diff| / max |reference| (`check_parts.rel_err`).

Command line: `conduit-lab gpu rerotation-split --shape 7b --layers 28 --vision-depth 32
--dtype bfloat16` (about 16 GB and 2 minutes on a CPU; its output in lab/gpu/NOTES.md).

Public API:
  rerotation_split(shape="tiny", layers=None, vision_depth=None, dtype="float32",
                   device="cpu", pages=2, tokens=64) -> dict
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from conduit_core.answer_types import PageInput
from conduit_core.runtime import ReuseRuntime
from lab.gpu.check_parts import fresh_keys, page_labels, rel_err, vision_rel_err
from lab.ttft import model as bench_model
from lab.ttft.model import ModelShape


def _cut(shape: str, layers: int | None, vision_depth: int | None) -> ModelShape:
    """`SHAPES[shape]` cut to `layers` / `vision_depth` layers (the widths kept)."""
    base = bench_model.SHAPES[shape]
    text = dict(base.text, num_hidden_layers=layers or base.text["num_hidden_layers"])
    depth = vision_depth or base.vision["depth"]
    vision = dict(base.vision, depth=depth, fullatt_block_indexes=[
        i for i in base.vision["fullatt_block_indexes"] if i < depth] or [depth - 1])
    return dataclasses.replace(base, text=text, vision=vision, vocab=8192,
                               notes=f"{shape}, cut")


def _keys64(rt: ReuseRuntime, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Layer-0 keys (kv, T, hd) in float64 of `embeds` (T, hidden) at `positions` (P, T)."""
    adapter = rt.adapter
    layer = adapter.layers[0]
    norm, proj = layer.input_layernorm, layer.self_attn.k_proj
    x = embeds.double()  # (T, hidden)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    x = x * norm.weight.double()
    k = x @ proj.weight.double().T
    if proj.bias is not None:
        k = k + proj.bias.double()
    k = k.view(1, x.shape[0], -1, layer.self_attn.head_dim).transpose(1, 2)  # (1, kv, T, hd)
    cos, sin = adapter.rotary(k, positions.to(adapter.device).unsqueeze(1))  # float32 tables
    return adapter.apply_rotary(k, cos.double(), sin.double())[0]


@torch.no_grad()
def rerotation_split(shape: str = "tiny", layers: int | None = None,
                     vision_depth: int | None = None, dtype: str = "float32",
                     device: str = "cpu", pages: int = 2, tokens: int = 64) -> dict[str, Any]:
    """The module docstring's four errors for each of `pages` pages of `tokens` tokens."""
    cut = layers is not None or vision_depth is not None
    name = f"{shape}-cut-{layers}-{vision_depth}" if cut else shape
    vlm = bench_model.build_bench_vlm(name, tokens_per_page=tokens, device=device,
                                      dtype=getattr(torch, dtype),
                                      spec=_cut(shape, layers, vision_depth) if cut else None)
    rt = ReuseRuntime(vlm, never_above_full=False)
    work = bench_model.make_workload(vlm, pages, 32)
    images = bench_model.bench_pages(pages, tokens)
    kvs = rt.prefill_pages(images)
    asm = rt.reuse.assemble(work.prefix, [PageInput(lab, kv) for lab, kv in
                                    zip(page_labels(len(kvs)), kvs, strict=True)], work.question)
    out = []
    for seg, kv, image in zip(asm.layout.segments, kvs, images, strict=True):
        positions = asm.layout.position_ids[:, seg.start:seg.stop]  # (P, T)
        got = asm.cache.keys[:, 0, :, seg.start:seg.stop]  # (L, kv, T, hd)
        truth = _keys64(rt, kv.embeds.to(rt.adapter.device, rt.adapter.dtype), positions)
        fresh = fresh_keys(rt, kv, positions)  # (L, kv, T, hd); layer 0 from the same embeds
        out.append({"vision": vision_rel_err(rt, kv, image),
                    "rotation_runtime": rel_err(got[0], truth),
                    "rotation_model": rel_err(fresh[0], truth),
                    "per_layer": [rel_err(g, f) for g, f in zip(got, fresh, strict=True)]})
    return {"shape": vlm.name, "dtype": dtype, "device": device, "tokens": tokens, "pages": out}
