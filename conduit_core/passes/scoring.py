"""Token scores from the scoring pass, and the knobs (the method: docs/METHOD.md, "The
scoring pass" and "Token scores and image-level amplification").

The scoring pass
(`conduit_core.passes.stale_pass`) yields, per layer l, the question rows' attention
probabilities over all keys `probs[l, h, q, j]` (softmax over all keys, query head h) and the
cached value norms `value_norms[l, g, j] = ||V[l, g, j]||_2` (pre-o_proj values, KV head g).
Query head h reads KV head g(h) = h // (H / G). CONDUIT's score is

    s_j = mean over layers, question tokens q of  agg over heads h of  A[l,h,q,j] ||V[l,g(h),j]||

with agg = mean by default. The raw-attention (SnapKV) and value-norm-only baselines drop one
factor of the product.

The scoring pass never holds every layer's probabilities: `ScoreAccumulator` keeps, per scored
layer, the probabilities summed over the scored question rows per query head (H, N) and the
value norms (G, N), written in place by the pass (one reduction a layer, whatever the number
of pages), and reduces them once at the end; its memory is L' (H + G) N floats, not
L' H Q' N, and does not grow with the question's length. With head_agg "max" (not linear in
the rows) it takes one layer and chunk of rows at a time into two (N,) running sums. The
tests hold the same reduction over all layers at once (`tests/core/helpers.token_scores`), the
reference the accumulator is tested against.

`ScoreConfig` holds the knobs a policy scores with (which layers, which question rows, how
heads and value norms are aggregated), validated on construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

HeadAgg = Literal["mean", "max"]
QueryRows = Literal["tail", "question"]
ValueNorm = Literal["raw", "layer"]


@dataclass(frozen=True)
class ScoreConfig:
    """How the per-layer scoring statistics are reduced to one score per token.

    layers:        "all"; a half-open range (start, stop) of decoder layer indices (negative
                   indices count from the end, Python style), at least one layer remaining;
                   or a depth f in (0, 1]: the first ceil(f * L) of the model's L layers,
                   the same share of depth on any model. The scoring pass stops after the
                   last scored layer (`conduit_core.passes.stale_pass`).
    query_window:  None = every question token; w >= 1 = only the last w question tokens
                   (the SnapKV observation window).
    head_agg:      "mean" or "max" over query heads.
    query_rows:    "tail" = every row after the last page (the question and the chat
                   template's generation prompt); "question" = the question's own tokens and
                   the last row (whose attention decides the first answer token), leaving out
                   the template's fixed tokens.
    value_norm:    "raw" = ||V|| as it is; "layer" = each layer's norms divided by their mean
                   over the keys, per KV head, so that no layer dominates by its scale.
    """

    layers: str | tuple[int, int] | float = "all"
    query_window: int | None = None
    head_agg: HeadAgg = "mean"
    query_rows: QueryRows = "tail"
    value_norm: ValueNorm = "raw"

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            if self.layers != "all":
                raise ValueError(f"layers must be 'all', (start, stop) or a depth in (0, 1], "
                                 f"got {self.layers!r}")
        elif isinstance(self.layers, float):
            if not 0.0 < self.layers <= 1.0:
                raise ValueError(f"layers depth must be in (0, 1], got {self.layers!r}")
        elif len(self.layers) != 2:
            raise ValueError(f"layers range must be (start, stop), got {self.layers!r}")
        if self.query_window is not None and self.query_window < 1:
            raise ValueError(f"query_window must be >= 1 or None, got {self.query_window}")
        if self.head_agg not in ("mean", "max"):
            raise ValueError(f"head_agg must be 'mean' or 'max', got {self.head_agg!r}")
        if self.query_rows not in ("tail", "question"):
            raise ValueError(f"query_rows must be 'tail' or 'question', got {self.query_rows!r}")
        if self.value_norm not in ("raw", "layer"):
            raise ValueError(f"value_norm must be 'raw' or 'layer', got {self.value_norm!r}")

    def layer_slice(self, n_layers: int) -> slice:
        """The selected layers as a slice of [0, n_layers); raises if it is empty."""
        if isinstance(self.layers, float):  # a depth: rounded to 1e-9 so 0.7 * 10 is 7
            sl = slice(0, math.ceil(round(self.layers * n_layers, 9)))
        else:
            sl = slice(None) if self.layers == "all" else slice(*self.layers)
        if len(range(n_layers)[sl]) == 0:
            raise ValueError(f"layers {self.layers!r} selects no layer of {n_layers}")
        return sl

    def scored_rows(self, n_question: int, n_prompt: int = 0) -> torch.Tensor:
        """Indices (Q',) into the `n_question` tail rows of those scored: by `query_rows`
        (`n_prompt`: the generation prompt's rows, last in the tail), then the last
        `query_window` of them."""
        rows = torch.arange(n_question)  # (n_question,)
        if self.query_rows == "question" and 0 < n_prompt < n_question:
            rows = torch.cat([rows[:n_question - n_prompt], rows[-1:]])
        return rows if self.query_window is None else rows[-self.query_window:]


class ScoreAccumulator:
    """Per-layer statistics of the scoring pass, reduced to per-token scores at the end (see
    the module docstring)."""

    def __init__(self, config: ScoreConfig, n_layers: int, n_question: int, n_keys: int,
                 device: torch.device | str = "cpu", n_prompt: int = 0):
        self.config = config
        self.layers = range(n_layers)[config.layer_slice(n_layers)]
        self.rows = config.scored_rows(n_question, n_prompt)  # (Q',)
        self._count = len(self.layers) * int(self.rows.numel())
        self._n_keys, self._device = n_keys, device
        self._weighted = torch.zeros(n_keys, dtype=torch.float32, device=device)  # (N,)
        self._attention = torch.zeros(n_keys, dtype=torch.float32, device=device)  # (N,)
        self._sums: torch.Tensor | None = None  # (L', H, N) head_agg "mean": row sums
        self._norms: torch.Tensor | None = None  # (L', G, N) value norms

    def slots(self, layer: int, heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where scored layer `layer` writes its probabilities summed over the scored rows
        per query head (H, N; head_agg "mean" only, the caller adds its chunks) and its value
        norms (G, N) float32; both are reduced once, in `result`. Every slot of a scored
        layer must be written before `result` (allocated, not cleared)."""
        sums, norms = self._buffers(heads, kv_heads)
        i = self.layers.index(layer)
        return sums[i], norms[i]

    def all_norms(self, heads: int, kv_heads: int) -> torch.Tensor:
        """The value-norm slots of every scored layer at once (L', G, N) float32, for a
        caller that writes them in one call."""
        return self._buffers(heads, kv_heads)[1]

    def _buffers(self, heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._sums is None or self._norms is None:
            n = len(self.layers)
            self._sums = torch.empty(n, heads, self._n_keys, dtype=torch.float32,
                                     device=self._device)  # (L', H, N)
            self._norms = torch.empty(n, kv_heads, self._n_keys, dtype=torch.float32,
                                      device=self._device)  # (L', G, N)
        return self._sums, self._norms

    def add(self, probs: torch.Tensor, value_norms: torch.Tensor) -> None:
        """head_agg "max": add one scored layer's probabilities probs (H, c, N) of c scored
        question rows, with that layer's value norms (G, N)."""
        heads, kv_heads = probs.shape[0], value_norms.shape[0]
        if self.config.value_norm == "layer":
            value_norms = value_norms / value_norms.mean(dim=-1, keepdim=True).clamp_min(1e-12)
        self._attention += probs.amax(dim=0).sum(dim=0)  # (N,)
        vn = value_norms.repeat_interleave(heads // kv_heads, dim=0)  # (H, N)
        self._weighted += (probs * vn.unsqueeze(1)).amax(dim=0).sum(dim=0)  # (N,)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean over scored layers and question rows: (weighted (N,), attention (N,))."""
        n = max(self._count, 1)
        if self._sums is not None and self._norms is not None and self.config.head_agg == "mean":
            sums, norms = self._sums, self._norms  # (L', H, N), (L', G, N)
            if self.config.value_norm == "layer":
                norms = norms / norms.mean(dim=-1, keepdim=True).clamp_min(1e-12)
            layers, kv_heads = norms.shape[:2]
            grouped = sums.view(layers, kv_heads, -1, sums.shape[-1])  # (L', G, rep, N)
            self._attention += sums.mean(dim=1).sum(dim=0)  # (N,)
            self._weighted += (grouped * norms.unsqueeze(2)).mean(dim=(1, 2)).sum(dim=0)
            self._sums = self._norms = None
        return self._weighted / n, self._attention / n

