"""Exactness 4: re-rotated cached keys equal keys computed directly at the new positions.

"Directly" = the model's own forward gives each page token's layer inputs in the context the
page was prefilled in; its own norm, k_proj, rotary embedding and apply_rotary_pos_emb then
produce the keys at the positions of the new layout (position ids from the family's rule).
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from conduit_core import PageInput, PageKV, ReuseRuntime
from conduit_core.errors import UnsupportedModelError
from conduit_core.model.adapters.base import check_rope
from conduit_core.prompt.layout import page_context
from conduit_core.prompt.rotation import rerotate_into, shift_cos_sin
from lab import answering
from tests.core.conftest import MROPE, load_builtin
from tests.core.helpers import (
    IMAGES,
    direct_keys,
    page_from_assembly,
    reference_hidden_states,
    segment_delta,
)
from tests.device import atol

QUESTION = "Which region had the highest sales?"


def _canonical_inputs(rt: ReuseRuntime, page: PageKV, image: Image.Image
                      ) -> tuple[tuple[torch.Tensor, ...], slice]:
    ctx = page_context(rt.adapter, page.token_ids, page.image_grid)
    seg = ctx.segments[0]
    return reference_hidden_states(rt.vlm, ctx.token_ids, [image]), slice(seg.start, seg.stop)


def _check(rt: ReuseRuntime, prefix: str, pages: list[tuple[str, PageKV]],
           sources: list[tuple[tuple[torch.Tensor, ...], slice]]) -> list[int]:
    asm = rt.reuse.assemble(prefix, [PageInput(lab, kv) for lab, kv in pages], QUESTION)
    deltas = []
    for seg, (_, kv), (layer_inputs, rows) in zip(asm.layout.segments, pages, sources,
                                                  strict=True):
        new_pos = asm.layout.position_ids[:, seg.start:seg.stop]  # (P, T)
        expected = direct_keys(rt.vlm, layer_inputs, rows, new_pos)  # (L, kv, T, hd)
        got = asm.cache.keys[:, 0, :, seg.start:seg.stop]
        assert (got - expected).abs().max().item() <= atol("keys")
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
    asm = runtime.reuse.assemble(prefix, [PageInput("Page 1:\n", a), PageInput("Page 2:\n", b)],
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
    asm = answering.assemble_fresh(runtime, prefix, pages, QUESTION)
    # full prefill: exact K/V at large positions
    answering.prefill(runtime, asm, asm.layout.visual_rows())
    late = page_from_assembly(runtime, asm, 1)  # page c as it sits late in that layout
    layer_inputs = reference_hidden_states(runtime.vlm, asm.layout.token_ids,
                                           [img for _, img in pages])
    seg = asm.layout.segments[1]
    deltas = _check(runtime, "", [("", late)], [(layer_inputs, slice(seg.start, seg.stop))])
    assert deltas[0] < 0


def _exact_rotation(rt: ReuseRuntime, keys: torch.Tensor, delta: int) -> torch.Tensor:
    """The rotation by `delta` positions in float64 from the model's own frequencies."""
    inv = rt.adapter.language_model.rotary_emb.inv_freq.double().to(keys.device)  # (hd/2,)
    angles = torch.cat((delta * inv, delta * inv))  # (hd,)
    k = keys.double()
    half = k.shape[-1] // 2
    turned = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
    return k * angles.cos() + turned * angles.sin()


def _turn(rt: ReuseRuntime, keys: torch.Tensor, delta: int,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """`keys` (L, kv, T, hd) turned by `delta` as the runtime turns a page on the CPU (one
    shift's row for all the page's rows, `rerotate_into`); into `out` when given."""
    out = torch.empty_like(keys) if out is None else out
    cos, sin = shift_cos_sin(rt.adapter, delta, keys.device)  # (hd,) each
    rerotate_into(keys, cos.view(1, -1), sin.view(1, -1), out)
    return out


def test_large_shifts_stay_exact(runtime: ReuseRuntime) -> None:
    """Shifts of long contexts (up to 10^6 positions, both directions) rotate cached keys
    as float64 math does; a float32 angle would be off by about delta * 6e-8 radians."""
    (page,) = runtime.prefill_pages([IMAGES["a"]])
    scale = float(page.keys.float().abs().max())
    # float32 math; keys of a lower precision are rounded once more on the way out
    rel = 2e-6 if page.keys.dtype == torch.float32 else 2.0 ** -8
    for delta in (32_768, 200_000, -150_000, 1_000_000):
        got = _turn(runtime, page.keys, delta)
        want = _exact_rotation(runtime, page.keys, delta)
        assert float((got.double() - want).abs().max()) <= rel * scale, delta
    # composing shifts: there and back again returns the cached keys
    back = _turn(runtime, _turn(runtime, page.keys, 123_457), -123_457)
    assert float((back.float() - page.keys.float()).abs().max()) <= 2 * rel * scale


def test_bfloat16_keys_rerotate_within_one_rounding(model_cache: Path) -> None:
    """bf16 cached keys: the rotation is float32 math, so the result is the exact rotation
    rounded once to bf16 (within one bf16 ulp of the largest key, 2^-8 relative)."""
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="bfloat16"))
    (page,) = rt.prefill_pages([IMAGES["a"]])
    assert page.keys.dtype == torch.bfloat16
    scale = float(page.keys.float().abs().max())
    for delta in (17, 4_096, -9, 250_000):
        got = _turn(rt, page.keys, delta)
        assert got.dtype == torch.bfloat16
        want = _exact_rotation(rt, page.keys, delta)
        assert float((got.double() - want).abs().max()) <= 2.0 ** -8 * scale, delta
    # and in place into a strided destination (the assembled cache's page rows)
    dest = torch.zeros(page.keys.shape[0], 2, page.keys.shape[1], page.keys.shape[2] + 3,
                       page.keys.shape[3], dtype=torch.bfloat16)
    _turn(rt, page.keys, 4_096, out=dest[:, 1, :, 3:])
    assert torch.equal(dest[:, 1, :, 3:], _turn(rt, page.keys, 4_096))
    assert float(dest[:, 0].abs().max()) == 0.0 and float(dest[:, 1, :, :3].abs().max()) == 0.0


@pytest.mark.parametrize("rope", [{"rope_type": "dynamic", "factor": 2.0},
                                  {"rope_type": "longrope", "short_factor": [1.0],
                                   "long_factor": [2.0]}])
def test_length_dependent_rope_is_refused(model_cache: Path, rope: dict[str, object]) -> None:
    vlm = load_builtin("builtin:tiny-internvl", model_cache)
    model = copy.deepcopy(vlm.model)
    cfg = model.config.get_text_config()
    cfg.rope_parameters = {**cfg.rope_parameters, **rope}
    with pytest.raises(UnsupportedModelError, match=f"rope_type '{rope['rope_type']}'"):
        type(vlm.adapter)(model, vlm.processor, vlm.tokenizer, vlm.adapter.max_image_tokens)


def test_position_independent_rope_types_are_accepted() -> None:
    for params in ({"rope_type": "default"}, {"rope_type": "linear", "factor": 2.0},
                   {"rope_type": "yarn", "factor": 4.0}, {"rope_type": "llama3"},
                   {"type": "mrope", "mrope_section": [2, 3, 3]}):
        check_rope(SimpleNamespace(rope_parameters=params), "test")
    check_rope(SimpleNamespace(rope_parameters=None, rope_scaling=None), "test")  # default
    per_layer = {"full_attention": {"rope_type": "default"},
                 "other": {"rope_type": "dynamic", "factor": 2.0}}
    with pytest.raises(UnsupportedModelError, match=r"rope_parameters\['other'\]"):
        check_rope(SimpleNamespace(rope_parameters=per_layer), "test")
    with pytest.raises(UnsupportedModelError, match="rope_scaling"):
        check_rope(SimpleNamespace(rope_scaling={"type": "dynamic", "factor": 2.0}), "test")
