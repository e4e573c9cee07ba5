"""Layer-by-layer forward of an arbitrary token subset over the runtime's KV cache.

Rows are sequence indices; each row computes q/k/v at its explicit position with the decoder
layer's own modules (norms, projections, rotary embedding, attention kernel, MLP), writes its
k/v into the cache in place, and attends over the cache with an exact causal mask: row r sees
the keys whose sequence index is <= its own. Masks are additive float tensors, correct under
both `sdpa` and `eager`. Under `sdpa` a masked subset runs grouped (`row_attention`: a fixed
number of row groups per layer, one sdpa call each, a group reading only the keys up to its
last row, the number chosen per device by `row_attention.row_groups`; `BLOCKED_ATTENTION`
off takes the one-mask reference path instead, for A/B measurements and tests); `eager` gets
the model's own attention function with one mask. Other attention implementations
(flash_attention_2, flex_attention, ...) are refused (`UnsupportedModelError`): they would
get a dense additive mask they do not honour, or a wrong one. What every layer of a forward
shares (its rotary cos/sin; its row groups or mask on the eager path, its padded rows on the
compiled one, each built when a forward first needs it) is built once (`RowSetup`), and a
caller that runs the same rows in two calls builds it once for both.

A layer observer sees each layer's queries and the cache after the layer's write; if it
computed the layer's attention output of every row (the scoring pass forms their
probabilities anyway) it returns it and the layer uses it instead of computing its own. At
the last layer run, rows outside the requested outputs only project and write their K/V:
their attention output and MLP feed nothing (no later layer, no logit). The keys each row's
attention computes on the path taken (`computed_key_counts`) are what the FLOPs accounting
charges.

Where the adapter's passes are compiled (`layer_graphs.compile_layers`) and the cache holds
the key bucket, each layer's body runs compiled at the rows' shape bucket instead
(`conduit_core.passes.buckets`: padded rows and keys, one dense mask, every row computing
the last layer in full); the loop over layers and the observer stay in Python.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter, check_attention
from conduit_core.passes.buckets import PaddedRows, clear_tail, fits, pad_rows
from conduit_core.passes.layer_graphs import LayerGraphs, layer_graphs
from conduit_core.passes.layer_groups import drained
from conduit_core.passes.row_attention import (
    RowBlock,
    blocked_attention,
    causal_row_mask,
    group_bounds,
    row_blocks,
    row_groups,
)

LayerObserver = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None]
BLOCKED_ATTENTION = True


@contextmanager
def blocked_rows(on: bool) -> Iterator[None]:
    """Within the block, `BLOCKED_ATTENTION` is `on` (A/B measurements and tests)."""
    global BLOCKED_ATTENTION
    saved, BLOCKED_ATTENTION = BLOCKED_ATTENTION, on
    try:
        yield
    finally:
        BLOCKED_ATTENTION = saved


def _attention_fn(attn: Any, impl: str) -> Callable[..., tuple[torch.Tensor, object]]:
    eager = sys.modules[type(attn).__module__].eager_attention_forward  # type: ignore[attr-defined]
    if impl == "eager":
        return eager  # type: ignore[no-any-return]
    return ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)  # type: ignore[no-any-return]


def _attn_impl(adapter: VLMAdapter) -> str:
    impl = adapter.attn_implementation
    check_attention(impl, adapter.family)  # also after a model.set_attn_implementation()
    return impl


def computed_key_counts(adapter: VLMAdapter, rows: torch.Tensor, n_keys: int,
                        plain_causal: bool = False) -> torch.Tensor:
    """Keys each of `rows` (R,) attends to as `forward_rows` computes them: (R,) int64."""
    rows = rows.to(torch.long).cpu()
    impl = _attn_impl(adapter)
    if plain_causal and impl != "eager":
        return rows + 1
    if impl == "sdpa" and BLOCKED_ATTENTION:
        bounds = group_bounds(rows, n_keys, row_groups(adapter.device))
        limits = np.array([limit for _, _, limit in bounds], dtype=np.int64)
        sizes = np.array([stop - start for start, stop, _ in bounds], dtype=np.int64)
        return torch.from_numpy(np.repeat(limits, sizes))  # (R,) each row its group's keys
    return torch.full_like(rows, n_keys)


@dataclass(eq=False)
class RowSetup:
    """What every layer of a forward of one row set shares, built once for every forward of
    those rows (`setup_rows`): the rows and their rotary cos/sin at once; the eager path's
    attention groups or mask (`attention`) and the compiled path's padded rows (`padded`)
    where a forward first needs them, so that neither path builds the other's."""

    adapter: VLMAdapter
    given: torch.Tensor  # (R,) sequence indices as the caller gave them (host or device)
    rows: torch.Tensor  # (R,) the same, on the adapter's device
    cos: torch.Tensor  # (B, R, hd) rotary cos of the rows' positions
    sin: torch.Tensor  # (B, R, hd)
    n_keys: int
    dtype: torch.dtype  # the hidden states'
    plain_causal: bool = False
    parent: tuple[RowSetup, torch.Tensor] | None = None  # (setup, places): a subset of it
    _attention: tuple[list[RowBlock] | None, torch.Tensor | None] | None = None
    _padded: dict[int, PaddedRows] = field(default_factory=dict)

    def attention(self) -> tuple[list[RowBlock] | None, torch.Tensor | None]:
        """The sdpa groups of a masked subset (None: not grouped) and the one additive mask
        (1, 1, R, n_keys) where not grouped and needed, built on first use; a subset's
        group taken from its parent's where that is one masked group (`_one_group_rows`)."""
        if self._attention is None:
            blocks = None
            if self.parent is not None:
                setup, places = self.parent
                blocks = _one_group_rows(self.adapter, setup.attention()[0], places,
                                         self.n_keys)
            self._attention = (blocks, None) if blocks is not None else _attention_setup(
                self.adapter, self.given, self.n_keys, self.plain_causal, self.dtype)
        return self._attention

    def padded(self, n_keys: int) -> PaddedRows:
        """The rows at their shape bucket over `n_keys` keys (`buckets.pad_rows`), built on
        first use."""
        if n_keys not in self._padded:
            self._padded[n_keys] = pad_rows(self.rows, self.cos, self.sin, n_keys, self.dtype)
        return self._padded[n_keys]

    def subset(self, adapter: VLMAdapter, places: torch.Tensor, n_keys: int) -> RowSetup:
        """The setup of rows `rows[places]` (places (R',) int64): cos/sin taken from this one
        (one gather each instead of the rotary embedding), attention groups built for them
        when first needed (taken from this one's where it is one group over `n_keys`)."""
        places = places.to(self.rows.device)
        rows = self.rows[places]  # (R',)
        cos, sin = self.cos[:, places], self.sin[:, places]  # (B, R', hd) each
        return RowSetup(adapter, rows, rows, cos, sin, n_keys, self.dtype,
                        parent=(self, places))


def _one_group_rows(adapter: VLMAdapter, blocks: list[RowBlock] | None, places: torch.Tensor,
                    n_keys: int) -> list[RowBlock] | None:
    """The group of rows `places` (R',) of `blocks`, where those are the one masked group
    over `n_keys` keys of a device that takes one sdpa call a layer: the mask's rows taken
    (one gather, where building a mask takes four operations); None otherwise."""
    if (blocks is None or len(blocks) != 1 or row_groups(adapter.device) != 1
            or blocks[0].n_keys != n_keys or blocks[0].mask is None):
        return None
    return [RowBlock(0, int(places.numel()), n_keys, blocks[0].mask[places])]


def _attention_setup(adapter: VLMAdapter, rows: torch.Tensor, n_keys: int, plain_causal: bool,
                     dtype: torch.dtype) -> tuple[list[RowBlock] | None, torch.Tensor | None]:
    """The sdpa groups (or the one additive mask) of `rows` attending over `n_keys` keys."""
    impl = _attn_impl(adapter)
    if plain_causal and impl != "eager":
        return None, None
    if impl == "sdpa" and BLOCKED_ATTENTION:
        return row_blocks(rows, n_keys, row_groups(adapter.device), dtype, adapter.device), None
    return None, causal_row_mask(rows.to(adapter.device), n_keys, dtype)  # (1, 1, R, n_keys)


def setup_rows(adapter: VLMAdapter, dtype: torch.dtype, rows: torch.Tensor,
               position_ids: torch.Tensor, *, n_keys: int,
               plain_causal: bool = False) -> RowSetup:
    """The `RowSetup` of rows (R,) at `position_ids` (P, B, R) for hidden states of `dtype`
    (see `forward_rows` for `plain_causal`)."""
    like = torch.empty(0, dtype=dtype, device=adapter.device)  # the rotary reads its dtype
    cos, sin = adapter.rotary(like, position_ids.to(adapter.device))  # (B, R, hd) each
    return RowSetup(adapter, rows, rows.to(adapter.device), cos, sin, n_keys, dtype,
                    plain_causal)


def forward_rows_steps(
    adapter: VLMAdapter,
    cache: KVCache,
    hidden: torch.Tensor,
    rows: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    n_keys: int,
    plain_causal: bool = False,
    observer: LayerObserver | None = None,
    layers: range | None = None,
    outputs: torch.Tensor | None = None,
    setup: RowSetup | None = None,
    half: str | None = None,
) -> Generator[str, None, torch.Tensor]:
    """Run `hidden` (B, R, hidden) of sequence indices `rows` (R,) at `position_ids`
    (P, B, R) through the decoder layers (all, or `layers`), writing their K/V into `cache`;
    with `half` on the eager path, yield it between each layer's attention and its MLP (but
    in a last layer that computes only `outputs`), so that a scheduler can run other work
    inside a layer. `forward_rows` runs the same to its end.

    `plain_causal=True` declares that the rows are either all of [0, n_keys) or the single
    last position n_keys - 1: sdpa then takes its own causal path (no mask tensor).
    `observer(layer, q, keys, values)` sees each layer's rotated queries
    (B, heads, R, hd) and the cache keys/values (B, kv_heads, n_keys, hd) after this
    layer's write; what it returns, if not None, is the layer's attention output
    (B, R, heads, hd) of every row.
    """
    impl = _attn_impl(adapter)
    if setup is None:
        setup = setup_rows(adapter, hidden.dtype, rows, position_ids, n_keys=n_keys,
                           plain_causal=plain_causal)
    run = layers if layers is not None else range(len(adapter.layers))
    graphs = layer_graphs(adapter)
    if graphs is not None and fits(cache, n_keys):
        return _forward_compiled(adapter, graphs, cache, hidden, setup, n_keys, impl, run,
                                 observer, outputs)
    rows, cos, sin = setup.rows, setup.cos, setup.sin
    blocks, mask = setup.attention()
    b, r, _ = hidden.shape
    last = run[-1] if len(run) else -1
    for li in run:
        layer = adapter.layers[li]
        attn = layer.self_attn
        residual = hidden
        h = layer.input_layernorm(hidden)  # (B, R, hidden)
        q, k, v = adapter.qkv(attn, h)  # (B, heads|kv_heads, R, hd)
        q = adapter.apply_rotary(q, cos, sin)
        k = adapter.apply_rotary(k, cos, sin)
        cache.write(li, rows, k, v)
        keys, values = cache.view(li, n_keys)  # (B, kv_heads, n_keys, hd)
        attended = observer(li, q, keys, values) if observer is not None else None
        if li == last and outputs is not None and outputs.numel() < r:
            return _output_rows(adapter, attn, layer, residual, q, keys, values, rows,
                                outputs.to(adapter.device), n_keys, impl, mask, blocks,
                                attended)
        if attended is not None:
            out = attended  # (B, R, heads, hd)
        elif blocks is not None:
            out = blocked_attention(q, keys, values, blocks, attn.scaling)  # (B, R, heads, hd)
        else:
            out, _ = _attention_fn(attn, impl)(
                attn, q, keys, values, mask, dropout=0.0, scaling=attn.scaling,
                is_causal=mask is None and r > 1,
            )  # (B, R, heads, hd)
        hidden = residual + attn.o_proj(out.reshape(b, r, -1))
        if half is not None:
            yield half
        residual = hidden
        hidden = residual + adapter.mlp(layer.mlp, layer.post_attention_layernorm(hidden))
    return hidden


forward_rows = drained(forward_rows_steps)  # the same, run to its end (a function)


def _forward_compiled(adapter: VLMAdapter, graphs: LayerGraphs, cache: KVCache,
                      hidden: torch.Tensor, setup: RowSetup, n_keys: int, impl: str,
                      run: range, observer: LayerObserver | None,
                      outputs: torch.Tensor | None) -> torch.Tensor:
    """`forward_rows` with each layer's body compiled at the rows' shape bucket
    (`conduit_core.passes.buckets`): every row computes the last layer in full, the
    `outputs` rows are taken after it."""
    b, r, _ = hidden.shape
    padded = setup.padded(n_keys)
    clear_tail(cache, n_keys)
    attention = _attention_fn(adapter.layers[0].self_attn, impl)
    k_b = padded.keys
    state = padded.pad(hidden)  # (B, R_b, hidden)
    for li in run:
        layer = adapter.layers[li]
        keys, values = cache.keys[li, :, :, :k_b], cache.values[li, :, :, :k_b]
        cache.writes += 1
        if observer is None:
            graphs.seen("body", state.shape[1], k_b)
            state = graphs.body(adapter, layer, attention, state, padded.cos, padded.sin,
                                padded.writes, keys, values, padded.mask)  # (B, R_b, hidden)
            continue
        q = graphs.project(adapter, layer, state, padded.cos, padded.sin, padded.writes,
                           keys, values)  # (B, heads, R_b, hd)
        attended = observer(li, q[:, :, :r], keys[:, :, :n_keys], values[:, :, :n_keys])
        if attended is not None:  # (B, R, heads, hd) -> (B, R_b, heads, hd)
            attended = padded.pad(attended.flatten(2)).view(b, -1, *attended.shape[2:])
        graphs.seen("project", state.shape[1], k_b)
        graphs.seen("finish" if attended is None else "finish+attended", state.shape[1], k_b)
        state = graphs.finish(adapter, layer, attention, state, q, keys, values, padded.mask,
                              attended)  # (B, R_b, hidden)
    out = state[:, :r]  # (B, R, hidden)
    if outputs is not None and outputs.numel() < r:
        out = out[:, outputs.to(out.device)]  # (B, R_o, hidden)
    return out


def _output_rows(adapter: VLMAdapter, attn: Any, layer: Any, residual: torch.Tensor,
                 q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
                 outputs: torch.Tensor, n_keys: int, impl: str, mask: torch.Tensor | None,
                 blocks: list[RowBlock] | None, attended: torch.Tensor | None) -> torch.Tensor:
    """The last layer's attention and MLP for the rows at positions `outputs` only
    (`attended`: every row's attention output, already computed; `mask`, `blocks`: every
    row's, as `forward_rows` has them)."""
    q = q[:, :, outputs]  # (B, heads, R_o, hd)
    b, r_o = q.shape[0], int(outputs.numel())
    if attended is not None:
        out = attended[:, outputs]  # (B, R_o, heads, hd)
    elif impl == "sdpa" and BLOCKED_ATTENTION:
        taken = _one_group_rows(adapter, blocks, outputs, n_keys)
        if taken is None:
            taken = row_blocks(rows[outputs], n_keys, row_groups(adapter.device), q.dtype,
                               adapter.device)
        out = blocked_attention(q, keys, values, taken, attn.scaling)  # (B, R_o, heads, hd)
    else:
        sub_mask = (mask[:, :, outputs] if mask is not None
                    else causal_row_mask(rows[outputs], n_keys, q.dtype))  # (1, 1, R_o, n_keys)
        out, _ = _attention_fn(attn, impl)(attn, q, keys, values, sub_mask, dropout=0.0,
                                           scaling=attn.scaling, is_causal=False)
    hidden = residual[:, outputs] + attn.o_proj(out.reshape(b, r_o, -1))  # (B, R_o, hidden)
    return hidden + adapter.mlp(layer.mlp, layer.post_attention_layernorm(hidden))


def logits_of(adapter: VLMAdapter, hidden: torch.Tensor) -> torch.Tensor:
    """Vocabulary logits (B, R, vocab) in float32 of last-layer hidden states (B, R, hidden)."""
    logits: torch.Tensor = adapter.lm_head(adapter.language_model.norm(hidden))
    return logits.float()
