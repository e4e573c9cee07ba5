"""Analytic FLOPs accounting of one request (docs/METHOD.md, "FLOPs accounting").

Language model, per decoder layer: every computed row pays the per-token linear cost
`c = 2 (2 d H dh + 2 d G dh + 3 d d_ff)` (q/o, k/v, gate/up/down; 2 FLOPs per multiply-add)
and `4 H dh` per (query, key) pair its attention computes (QK^T and AV). Hence
  full prefill  = L [N c + 4 H dh N (N + 1) / 2]          (causal pairs: row r sees 0..r)
  refresh       = L [(N_t + k) c + 4 H dh * sum of computed key counts of the rows]
  scoring       = L [N_t c + 4 H dh * sum of computed key counts of the text rows]
                  + L' Q' N (H (2 dh + SCORE_PAIR_FLOPS) ) + L' G N 2 dh
Charged as computed: a masked subset runs grouped (`row_attention`): every row of one of a
fixed number of row groups computes every key up to the group's last row, so it is charged
that count,
not its causal one (`layer_forward.computed_key_counts` mirrors the path `forward_rows`
takes; the one-mask reference path computes all N keys per row and is charged N). The
scoring pass also forms its scored question rows' (Q', the query window) float32 QK^T over
all N keys at the scored layers (L'), the softmax and the norm-weighted reduction
(`SCORE_PAIR_FLOPS` = 8 per pair and head: max, subtract, exp, sum, divide, multiply by the
norm, two adds), and the value norms (2 dh per key and KV head). The runtime charges the
refresh only for the rows it actually computes: text rows before the first refreshed visual
token come out of the scoring pass exact and are not run again.

Left out, with bounds: the plain causal path (full prefill, and decode's one row) is charged
its causal pairs N (N + 1) / 2; flash and memory-efficient kernels compute about that (whole
tiles on the diagonal: at most one tile of 64-128 keys more per row), while the CPU math
kernel forms the full N^2 square and masks it (at most 2x the attention term, never the
linear term). Norms, residual adds, rotary embedding, SiLU and the final norm are a few FLOPs
per hidden unit per row, under 0.1% of `c` at d >= 1,000. Decode is excluded. The vision
tower is counted separately (`vision_flops`): a full prefill pays it, reuse does not (page
embeddings are cached).

The runtime charges through one `FlopsModel` per loaded model (`FlopsModel.from_adapter`);
the shapes (`LMShape`, `VisionShape`, `TiledVisionShape`) are read from the model's config,
and a vision tower of a family not known here raises `UnsupportedModelError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conduit_core.errors import UnsupportedModelError


@dataclass(frozen=True)
class LMShape:
    """The sizes of a decoder-only language model that FLOPs depend on."""

    layers: int  # L
    hidden: int  # d
    heads: int  # H, query heads
    kv_heads: int  # G
    head_dim: int  # dh
    intermediate: int  # d_ff, gated MLP width

    @classmethod
    def from_config(cls, cfg: Any) -> LMShape:
        """Read a transformers text config (Qwen2 style field names)."""
        heads = int(cfg.num_attention_heads)
        head_dim = getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads
        return cls(layers=int(cfg.num_hidden_layers), hidden=int(cfg.hidden_size), heads=heads,
                   kv_heads=int(cfg.num_key_value_heads), head_dim=int(head_dim),
                   intermediate=int(cfg.intermediate_size))

    @property
    def pair_cost(self) -> int:
        """FLOPs per (query, key) pair per layer: 4 H dh."""
        return 4 * self.heads * self.head_dim


def linear_cost(shape: LMShape) -> float:
    """Per-token linear FLOPs of one layer: c = 2 (2 d H dh + 2 d G dh + 3 d d_ff)."""
    d, hd = shape.hidden, shape.head_dim
    return float(2 * (2 * d * shape.heads * hd + 2 * d * shape.kv_heads * hd
                      + 3 * d * shape.intermediate))


SCORE_PAIR_FLOPS = 8


def rows_flops(shape: LMShape, rows: torch.Tensor | Sequence[int],
               n_layers: int | None = None,
               key_counts: torch.Tensor | None = None) -> float:
    """FLOPs of computing the rows at sequence indices `rows` through `n_layers` layers
    (default all): n_layers [R c + 4 H dh * sum of key counts], a row's key count being the
    keys its attention computes (default r + 1, causal)."""
    idx = torch.as_tensor(rows, dtype=torch.float64).view(-1)  # (R,)
    n_layers = shape.layers if n_layers is None else n_layers
    keys = float((idx + 1).sum()) if key_counts is None else float(key_counts.double().sum())
    return n_layers * (idx.numel() * linear_cost(shape) + shape.pair_cost * keys)


def projection_cost(shape: LMShape) -> float:
    """Per-token FLOPs of one layer's q, k and v projections only: 2 (d H dh + 2 d G dh).
    A row whose last-layer output nothing reads pays this at that layer (`forward_rows`
    with `outputs`): its K/V are written, its attention output and MLP are not computed."""
    d, hd = shape.hidden, shape.head_dim
    return float(2 * (d * shape.heads * hd + 2 * d * shape.kv_heads * hd))


def trimmed_rows_flops(shape: LMShape, rows: torch.Tensor | Sequence[int], n_layers: int,
                       key_counts: torch.Tensor | None, output_key_counts: torch.Tensor) -> float:
    """`rows_flops` of a run whose last layer computes attention and MLP only for the
    output rows (their key counts `output_key_counts`, (R_o,)); the other rows pay the
    projections there."""
    n_rows = torch.as_tensor(rows).numel()
    if n_layers <= 0 or n_rows == 0:
        return 0.0
    before = rows_flops(shape, rows, n_layers - 1, key_counts)
    n_out = output_key_counts.numel()
    last = (n_rows * projection_cost(shape) + n_out * (linear_cost(shape) - projection_cost(shape))
            + shape.pair_cost * float(output_key_counts.double().sum()))
    return before + last


def scoring_flops(shape: LMShape, n_question: int, n_keys: int, n_layers: int) -> float:
    """The scoring pass's work beyond its rows' forward: at each of `n_layers` scored layers,
    `n_question` rows' float32 QK^T over `n_keys` keys for every query head, softmax and the
    norm-weighted reduction, and the value norms of every key."""
    pairs = n_question * n_keys * shape.heads * (2 * shape.head_dim + SCORE_PAIR_FLOPS)
    norms = 2 * shape.kv_heads * shape.head_dim * n_keys
    return float(n_layers * (pairs + norms))


def value_mix_flops(shape: LMShape, key_count: float, n_layers: int) -> float:
    """Probabilities times values over `key_count` (row, key) pairs in all, for every query
    head, at `n_layers` layers: 2 H dh per pair. The scoring pass's attention output where
    its probabilities stand in for the layer's attention (`conduit_core.passes.stale_pass`)."""
    return float(n_layers * key_count * 2 * shape.heads * shape.head_dim)


def full_prefill_flops(shape: LMShape, n: int) -> float:
    """Language-model FLOPs of a causal prefill of `n` tokens: L [N c + 4 H dh N (N+1) / 2]."""
    return shape.layers * (n * linear_cost(shape) + shape.pair_cost * n * (n + 1) / 2)


@dataclass(frozen=True)
class VisionShape:
    """A ViT vision tower with a patch merger/projector, as FLOPs see it.

    Per patch: the patch embedding (`patch_in` -> `embed`), `depth` blocks of
    qkv + output projection and an MLP (`mlp_hidden`, `mlp_mats` = 2 plain or 3 gated),
    bidirectional attention over the patches of one image (`4 embed` per pair, windowed when
    `window` > 0 on all blocks but `full_blocks`); then per merged token (`merge`^2 patches)
    a two-layer merger `merge^2 embed -> merger_hidden -> out_hidden`.
    """

    patch_in: int
    embed: int
    depth: int
    mlp_hidden: int
    mlp_mats: int
    merge: int
    merger_hidden: int
    out_hidden: int
    window: int = 0  # patches per window side after merging (Qwen2.5-VL), 0 = global
    full_blocks: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: Any) -> VisionShape:
        """The vision shape of a supported model config (by `model_type`)."""
        vc = config.vision_config
        kind = config.model_type
        if kind == "qwen2_vl":
            m = int(vc.spatial_merge_size)
            return cls(patch_in=int(vc.in_channels) * int(vc.temporal_patch_size)
                       * int(vc.patch_size) ** 2, embed=int(vc.embed_dim), depth=int(vc.depth),
                       mlp_hidden=int(vc.embed_dim * vc.mlp_ratio), mlp_mats=2, merge=m,
                       merger_hidden=int(vc.embed_dim) * m * m, out_hidden=int(vc.hidden_size))
        if kind == "qwen2_5_vl":
            m = int(vc.spatial_merge_size)
            win = int(vc.window_size) // int(vc.patch_size) // m
            return cls(patch_in=int(vc.in_channels) * int(vc.temporal_patch_size)
                       * int(vc.patch_size) ** 2, embed=int(vc.hidden_size), depth=int(vc.depth),
                       mlp_hidden=int(vc.intermediate_size), mlp_mats=3, merge=m,
                       merger_hidden=int(vc.hidden_size) * m * m,
                       out_hidden=int(vc.out_hidden_size), window=win,
                       full_blocks=tuple(int(i) for i in vc.fullatt_block_indexes))
        raise UnsupportedModelError(f"no vision FLOPs model for model_type {kind!r}")


def _window_pairs(gh: int, gw: int, merge: int, window: int) -> int:
    """Sum over attention windows of (patches in window)^2 for one frame of gh x gw patches
    grouped into windows of `window` merged tokens per side (the last ones truncated)."""
    mh, mw = gh // merge, gw // merge
    total = 0
    for r0 in range(0, mh, window):
        for c0 in range(0, mw, window):
            n = min(window, mh - r0) * min(window, mw - c0) * merge * merge
            total += n * n
    return total


def _grid_flops(shape: VisionShape, grids: Sequence[torch.Tensor | Sequence[int]]) -> float:
    """Vision-tower FLOPs of encoding images with patch grids (t, h, w), one per page."""
    total = 0.0
    m2 = shape.merge * shape.merge
    block_linear = 2 * (4 * shape.embed * shape.embed
                        + shape.mlp_mats * shape.embed * shape.mlp_hidden)
    for grid in grids:
        t, gh, gw = (int(x) for x in grid)
        patches = t * gh * gw
        total += 2 * patches * shape.patch_in * shape.embed  # patch embedding
        total += shape.depth * patches * block_linear
        full_pairs = t * (gh * gw) ** 2  # attention within each frame of the image
        win_pairs = t * _window_pairs(gh, gw, shape.merge, shape.window) if shape.window else 0
        for b in range(shape.depth):
            pairs = full_pairs if (not shape.window or b in shape.full_blocks) else win_pairs
            total += 4 * shape.embed * pairs
        merged = patches // m2
        total += 2 * merged * (m2 * shape.embed * shape.merger_hidden
                               + shape.merger_hidden * shape.out_hidden)
    return total


@dataclass(frozen=True)
class TiledVisionShape:
    """A ViT run on fixed-size tiles, then a two-layer projector: FLOPs = tiles x per tile.

    Per tile: `tokens` (= patches + `cls` extra tokens) through `depth` blocks of
    q/k/v/o projections, a 2-matrix MLP (`mlp_hidden`) and full attention over the tile;
    an optional attention-pooling head (SigLIP `vision_use_head`); then `proj_tokens` tokens of
    width `proj_in` through `proj_in -> proj_hidden -> proj_hidden`.
    """

    patches: int
    cls: int
    patch_in: int
    embed: int
    depth: int
    mlp_hidden: int
    head: bool
    proj_tokens: int
    proj_in: int
    proj_hidden: int

    @classmethod
    def from_config(cls, config: Any) -> TiledVisionShape:
        """The tile shape of a LLaVA-OneVision or InternVL config."""
        vc = config.vision_config
        kind = config.model_type
        if not isinstance(config.vision_feature_layer, int):
            raise UnsupportedModelError("several vision feature layers: no analytic FLOPs")
        drop = 1 if config.vision_feature_select_strategy == "default" else 0
        if kind == "llava_onevision":
            patches = (int(vc.image_size) // int(vc.patch_size)) ** 2
            return cls(patches=patches, cls=0, patch_in=int(vc.num_channels)
                       * int(vc.patch_size) ** 2, embed=int(vc.hidden_size),
                       depth=int(vc.num_hidden_layers), mlp_hidden=int(vc.intermediate_size),
                       head=bool(getattr(vc, "vision_use_head", False)),
                       proj_tokens=patches - drop, proj_in=int(vc.hidden_size),
                       proj_hidden=int(config.text_config.hidden_size))
        if kind == "internvl":
            side = int(vc.image_size[0]) // int(vc.patch_size[0])
            shuffle = float(config.downsample_ratio) ** 2
            return cls(patches=side * side, cls=1, patch_in=int(vc.num_channels)
                       * int(vc.patch_size[0]) * int(vc.patch_size[1]),
                       embed=int(vc.hidden_size), depth=int(vc.num_hidden_layers),
                       mlp_hidden=int(vc.intermediate_size), head=False,
                       proj_tokens=round((side * side + 1 - drop) * shuffle),
                       proj_in=round(int(vc.hidden_size) / shuffle),
                       proj_hidden=int(config.text_config.hidden_size))
        raise UnsupportedModelError(f"no tiled vision FLOPs model for model_type {kind!r}")

    def per_tile(self) -> float:
        """FLOPs of one tile through tower, head and projector."""
        e, t = self.embed, self.patches + self.cls
        total = 2 * self.patches * self.patch_in * e  # patch embedding
        total += self.depth * (2 * t * (4 * e * e + 2 * e * self.mlp_hidden) + 4 * e * t * t)
        if self.head:  # one probe query: q, k/v over the tile, attention, out proj, MLP
            total += 2 * e * e + 4 * t * e * e + 4 * e * t + 2 * e * e + 4 * e * self.mlp_hidden
        total += 2 * self.proj_tokens * (self.proj_in * self.proj_hidden
                                         + self.proj_hidden * self.proj_hidden)
        return float(total)


def vision_shape(config: Any) -> VisionShape | TiledVisionShape:
    """The analytic vision shape of a supported model config."""
    if config.model_type in ("llava_onevision", "internvl"):
        return TiledVisionShape.from_config(config)
    return VisionShape.from_config(config)


def vision_tower_flops(shape: VisionShape | TiledVisionShape,
                       grids: Sequence[torch.Tensor | Sequence[int]]) -> float:
    """Vision FLOPs of encoding images with these grids, one per page: (t, h, w) patch grids
    for `VisionShape`; (tiles, ...) for `TiledVisionShape`."""
    if isinstance(shape, TiledVisionShape):
        return sum(int(g[0]) for g in grids) * shape.per_tile()
    return _grid_flops(shape, grids)


@dataclass(frozen=True)
class FlopsModel:
    """FLOPs accounting for one loaded model (language model + vision tower)."""

    lm: LMShape
    vision_shape: VisionShape | TiledVisionShape | None  # None: no analytic model here

    @classmethod
    def from_adapter(cls, adapter: Any) -> FlopsModel:
        """Shapes of the adapter's model (`adapter.model.config`)."""
        config = adapter.model.config
        try:
            vision: VisionShape | TiledVisionShape | None = vision_shape(config)
        except UnsupportedModelError:
            vision = None
        return cls(lm=LMShape.from_config(config.get_text_config()), vision_shape=vision)

    def rows(self, rows: torch.Tensor | Sequence[int], n_layers: int | None = None,
             key_counts: torch.Tensor | None = None) -> float:
        """Language-model FLOPs of computing rows `rows` (see `rows_flops`)."""
        return rows_flops(self.lm, rows, n_layers, key_counts)

    def trimmed(self, rows: torch.Tensor | Sequence[int], n_layers: int,
                key_counts: torch.Tensor | None, output_key_counts: torch.Tensor) -> float:
        """Rows whose last layer runs in full only for the outputs (`trimmed_rows_flops`)."""
        return trimmed_rows_flops(self.lm, rows, n_layers, key_counts, output_key_counts)

    def scoring(self, n_question: int, n_keys: int, n_layers: int) -> float:
        """The scoring pass's probabilities and value norms (see `scoring_flops`)."""
        return scoring_flops(self.lm, n_question, n_keys, n_layers)

    def value_mix(self, key_count: float, n_layers: int) -> float:
        """Probabilities times values over `key_count` pairs (see `value_mix_flops`)."""
        return value_mix_flops(self.lm, key_count, n_layers)

    def full(self, n: int) -> float:
        """Language-model FLOPs of a full causal prefill of `n` tokens."""
        return full_prefill_flops(self.lm, n)

    def vision(self, grids: Sequence[torch.Tensor | Sequence[int]]) -> float:
        """Vision-tower FLOPs of encoding pages with these patch grids."""
        if self.vision_shape is None:
            raise UnsupportedModelError("no analytic vision FLOPs model for this family")
        return vision_tower_flops(self.vision_shape, grids)


def vision_flops(adapter: Any, grids: Sequence[torch.Tensor | Sequence[int]]) -> float:
    """Vision-tower FLOPs of pages with patch grids `grids` for the adapter's model; raises
    `UnsupportedModelError` where the family's tower has no analytic model."""
    return vision_tower_flops(vision_shape(adapter.model.config), grids)
