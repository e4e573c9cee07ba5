"""Exactness 4: re-rotated cached keys equal keys computed directly at the new positions.

"Directly" = the model's own forward gives each page token's layer inputs in the context the
page was prefilled in; its own norm, k_proj, rotary embedding and apply_rotary_pos_emb then
produce the keys at the positions of the new layout (position ids from the family's rule).
"""

from __future__ import annotations

import torch
from PIL import Image

from conduit_core import PageInput, PageKV, ReuseRuntime
from conduit_core.layout import page_context
from conduit_core.rotation import segment_delta
from tests.core.conftest import MROPE
from tests.core.helpers import (
    IMAGES,
    direct_keys,
    page_from_assembly,
    reference_hidden_states,
)

QUESTION = "Which region had the highest sales?"


def _canonical_inputs(rt: ReuseRuntime, page: PageKV, image: Image.Image
                      ) -> tuple[tuple[torch.Tensor, ...], slice]:
    ctx = page_context(rt.adapter, page.token_ids, page.image_grid)
    seg = ctx.segments[0]
    return reference_hidden_states(rt.vlm, ctx.token_ids, [image]), slice(seg.start, seg.stop)


def _check(rt: ReuseRuntime, prefix: str, pages: list[tuple[str, PageKV]],
           sources: list[tuple[tuple[torch.Tensor, ...], slice]]) -> list[int]:
    asm = rt.assemble(prefix, [PageInput(lab, kv) for lab, kv in pages], QUESTION)
    deltas = []
    for seg, (_, kv), (layer_inputs, rows) in zip(asm.layout.segments, pages, sources,
                                                  strict=True):
        new_pos = asm.layout.position_ids[:, seg.start:seg.stop]  # (P, T)
        expected = direct_keys(rt.vlm, layer_inputs, rows, new_pos)  # (L, kv, T, hd)
        got = asm.cache.keys[:, 0, :, seg.start:seg.stop]
        assert (got - expected).abs().max().item() <= 1e-5
        deltas.append(segment_delta(kv.position_ids, new_pos))
    return deltas


def test_rerotation_under_prefix_with_image_and_permutation(runtime: ReuseRuntime,
                                                            family: str) -> None:
    imgs = [IMAGES["a"], IMAGES["b"]]
    a, b = runtime.prefill_pages(imgs)
    src_a, src_b = (_canonical_inputs(runtime, kv, img) for kv, img in zip((a, b), imgs,
                                                                            strict=True))
    prefix = "You answer questions about a long annual report of the company."
    # page b follows an image (page a): under M-RoPE its shift is not a token count
    deltas = _check(runtime, prefix, [("Page 1:\n", a), ("Page 2:\n", b)], [src_a, src_b])
    assert all(d > 0 for d in deltas)  # moved to larger positions
    asm = runtime.assemble(prefix, [PageInput("Page 1:\n", a), PageInput("Page 2:\n", b)],
                           QUESTION)
    seg_b = asm.layout.segments[1]
    token_delta = seg_b.start - page_context(runtime.adapter, b.token_ids,
                                             b.image_grid).segments[0].start
    if family in MROPE:
        assert deltas[1] != token_delta
    else:
        assert deltas[1] == token_delta
    # permuted order
    _check(runtime, prefix, [("Page 2:\n", b), ("Page 1:\n", a)], [src_b, src_a])


def test_rerotation_to_smaller_positions(runtime: ReuseRuntime) -> None:
    prefix = ("Read the pages below carefully. They come from a scanned report; the table on "
              "page two shows the sales by region for every quarter of the year.")
    pages = [("First page:\n", IMAGES["b"]), ("Second page:\n", IMAGES["c"])]
    asm = runtime.assemble_fresh(prefix, pages, QUESTION)
    runtime.prefill(asm, asm.layout.visual_rows())  # full prefill: exact K/V at large positions
    late = page_from_assembly(runtime, asm, 1)  # page c as it sits late in that layout
    layer_inputs = reference_hidden_states(runtime.vlm, asm.layout.token_ids,
                                           [img for _, img in pages])
    seg = asm.layout.segments[1]
    deltas = _check(runtime, "", [("", late)], [(layer_inputs, slice(seg.start, seg.stop))])
    assert deltas[0] < 0
