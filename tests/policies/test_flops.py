"""FLOPs accounting: hand-computed small cases, and the analytic linear/vision terms against
torch's own FLOP counter on the tiny model (eager attention, so attention matmuls count)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conduit_core.model.builtin import builtin_names
from conduit_core.model.flops import (
    LMShape,
    TiledVisionShape,
    VisionShape,
    full_prefill_flops,
    linear_cost,
    rows_flops,
    value_mix_flops,
    vision_flops,
    vision_shape,
    vision_tower_flops,
)
from conduit_core.model.loader import load_vlm

from .conftest import text_page

SMALL = LMShape(layers=2, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8)


def test_linear_cost_by_hand() -> None:
    # 2 * (2*4*2*2 + 2*4*1*2 + 3*4*8) = 2 * (32 + 16 + 96)
    assert linear_cost(SMALL) == 288.0
    assert SMALL.pair_cost == 16


def test_full_prefill_by_hand() -> None:
    # L [N c + 4 H dh N (N + 1) / 2] = 2 * (3 * 288 + 16 * 6)
    assert full_prefill_flops(SMALL, 3) == 1920.0
    assert rows_flops(SMALL, torch.arange(3)) == 1920.0


def test_refresh_rows_by_hand() -> None:
    # rows 0 and 2 see 1 and 3 keys: 2 * (2 * 288 + 16 * 4)
    assert rows_flops(SMALL, [0, 2]) == 1280.0
    assert rows_flops(SMALL, [0, 2], n_layers=1) == 640.0
    assert rows_flops(SMALL, []) == 0.0


def test_value_mix_by_hand() -> None:
    # probabilities times values: 2 H dh per (row, key) pair per layer = 2 * 2 * 2 * 5 pairs
    assert value_mix_flops(SMALL, 5, 1) == 40.0
    assert value_mix_flops(SMALL, 5, 2) == 80.0
    assert value_mix_flops(SMALL, 5, 2) == SMALL.pair_cost * 5 * 2 / 2  # half of attention


def test_scoring_plus_refresh_below_full_only_for_small_sets() -> None:
    n, text = 100, torch.tensor([0, 1, 2, 97, 98, 99])
    scoring = rows_flops(SMALL, text)
    refresh = rows_flops(SMALL, torch.cat([text, torch.arange(10, 20)]).unique())
    assert scoring + refresh < full_prefill_flops(SMALL, n)
    assert rows_flops(SMALL, torch.arange(n)) == full_prefill_flops(SMALL, n)


def test_vision_window_pairs_by_hand() -> None:
    # 8x8 patches, merge 2 -> 4x4 merged, windows of 2x2 merged = 4 windows of 16 patches
    shape = VisionShape(patch_in=1, embed=1, depth=1, mlp_hidden=1, mlp_mats=2, merge=2,
                        merger_hidden=1, out_hidden=1, window=2, full_blocks=())
    windowed = vision_tower_flops(shape, [(1, 8, 8)])
    full = vision_tower_flops(VisionShape(1, 1, 1, 1, 2, 2, 1, 1), [(1, 8, 8)])
    assert full - windowed == 4 * (64 * 64 - 4 * 16 * 16)


def test_tiled_vision_by_hand() -> None:
    shape = TiledVisionShape(patches=4, cls=1, patch_in=3, embed=2, depth=1, mlp_hidden=4,
                             head=False, proj_tokens=1, proj_in=8, proj_hidden=2)
    # patch 2*4*3*2 + block 2*5*(4*4 + 2*2*4) + 4*2*25 + projector 2*1*(8*2 + 2*2)
    assert shape.per_tile() == 48 + 320 + 200 + 40
    headed = TiledVisionShape(**{**shape.__dict__, "head": True})
    # probe q 2*4, k/v 4*5*4, attention 4*2*5, out 2*4, MLP 4*2*4
    assert headed.per_tile() - shape.per_tile() == 8 + 80 + 40 + 8 + 32
    assert vision_tower_flops(shape, [(3, 0, 0), (2, 9, 9)]) == 5 * shape.per_tile()


def test_lm_terms_match_torch_counter(tmp_path_factory: pytest.TempPathFactory) -> None:
    vlm = load_vlm("builtin:tiny-qwen2-vl", cache_dir=Path(tmp_path_factory.mktemp("m")),
                   attn_implementation="eager")
    model = vlm.model
    shape = LMShape.from_config(model.config.get_text_config())
    n = 12
    with FlopCounterMode(display=False) as counter:
        model.model.language_model(input_ids=torch.arange(n).view(1, n))
    # torch counts every (query, key) pair of the eager matmuls, the masked ones included
    counted_pairs = shape.layers * shape.pair_cost * n * n
    assert counter.get_total_flops() == shape.layers * n * linear_cost(shape) + counted_pairs


@pytest.mark.parametrize("name", [n for n in builtin_names() if n.startswith("builtin:tiny-")])
def test_vision_flops_match_torch_counter(name: str,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    """Analytic vision FLOPs equal torch's count of the adapter's own page encoding (vision
    tower, merger/projector; window attention for Qwen2.5-VL, tiles for the others)."""
    vlm = load_vlm(name, cache_dir=Path(tmp_path_factory.mktemp("m")),
                   attn_implementation="eager")
    adapter = vlm.adapter
    pages = adapter.prepare_pages([text_page(0, (112, 112)), text_page(1, (140, 84)),
                                   text_page(2, (300, 500))])
    with FlopCounterMode(display=False) as counter:
        adapter.page_embeds(pages)
    grids = [p.image_grid for p in pages]
    assert vision_flops(adapter, grids) == counter.get_total_flops()
    assert vision_tower_flops(vision_shape(vlm.model.config), grids) == counter.get_total_flops()
