"""The scoring ("stale") pass: text rows over the assembled, not yet refreshed cache.

All text tokens run through the layers up to the last scored one (every layer by default; a
pass that stops earlier costs that share of the layers) against the stale, re-rotated page
KV (exact causal mask, writing their own fresh K/V). At each scored layer (only the
configured layers and question rows are scored) the scored rows' attention probabilities
over all N keys are formed per query head and reduced at once, with the layer's value norms,
into the layer's statistics (`conduit_core.passes.scoring.ScoreAccumulator`). No
probabilities outlive their layer, and the rows are taken in chunks of at most
`SCORE_CHUNK_ELEMENTS` probabilities, so memory stays bounded however long the question
(`ScoreConfig.query_window` may also window it). A layer issues a fixed number of operations
per chunk; the value norms are taken in one call after the pass (a layer's values are final
once it has run), or per layer for head_agg "max".

The scores (`StaleScores`): `weighted` is CONDUIT's s_j, the mean over scored layers and
question rows of the heads' aggregate of A[l,h,q,j] ||V[l,g(h),j]||_2 (pre-o_proj values);
`attention` is the same without the value norm. A pass through every layer hands on its text
rows' last-layer hidden states (of the last row only with `last_only`, the answer path),
which the runtime reuses for the rows before the first refreshed visual token; every pass
hands on their states after layer 0: layer 0's K/V are exact in the stale cache (a page
token's layer-0 input is its own embedding, its key only re-rotated), so a refresh starts
its text rows at layer 1 from them (`text_from_layer_one`). Where the scored rows are every
text row (the default), their probabilities also give each scored layer's attention output,
so no layer computes the same QK^T twice (`fused_layers`; at the pass's last layer, where it
computes one output row, under `last_only` or where it stops early, that row is computed by
the layer itself). That holds on the devices of `FUSED_SCORES` (the CPU, where QK^T's
arithmetic is the cost); an accelerator, bound by the kernels it launches, lets the layer's
own sdpa call compute the output and forms only the probabilities, which takes fewer
launches (no value cast, product or output copy; issue 65).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.layer_forward import RowSetup, forward_rows, setup_rows
from conduit_core.passes.layer_groups import layer_groups
from conduit_core.passes.scoring import ScoreAccumulator, ScoreConfig

SCORE_CHUNK_ELEMENTS = 1 << 24
FUSED_SCORES = {"cpu"}  # devices whose scored layers take their output from the probabilities


@dataclass
class StaleScores:
    """Per-token scores from the stale pass (see the module docstring)."""

    weighted: torch.Tensor  # (N,) float32
    attention: torch.Tensor  # (N,) float32
    config: ScoreConfig
    question_rows: torch.Tensor  # (n_question,) sequence indices
    text_rows: torch.Tensor  # (N_t,) sequence indices that were computed, on the host
    text_hidden: torch.Tensor | None = None  # (N_t | 1, hidden) last-layer hidden states
    after_first: torch.Tensor | None = None  # (N_t, hidden) after layer 0 (exact)
    probs: torch.Tensor | None = None  # (L', H, Q', N) only when asked for (tests, diagnostics)


def pass_layers(config: ScoreConfig, n_layers: int) -> int:
    """How many decoder layers the scoring pass under `config` runs: up to its last scored
    layer (all `n_layers` when that is the model's last)."""
    return range(n_layers)[config.layer_slice(n_layers)].stop


def trimmed_last(config: ScoreConfig, n_layers: int, last_only: bool) -> bool:
    """Whether the pass's last layer computes its last row's output only: under
    `last_only`, or where the pass stops early (nothing reads its output), but not where
    that layer is layer 0 of a deeper model (its every output is kept: `after_first`)."""
    stop = pass_layers(config, n_layers)
    return (last_only or stop < n_layers) and (stop > 1 or n_layers == 1)


def fused_layers(scored_layers: range, n_scored: int, n_text: int, trimmed: bool,
                 device: torch.device | str) -> list[int]:
    """The scored layers at which the scoring pass's probabilities are the layer's attention
    on `device`: none off `FUSED_SCORES`; else all of them when the scored rows are every
    text row of the pass (none otherwise), but the pass's last layer where it computes only
    its last row's output (`trimmed`: `trimmed_last`)."""
    if torch.device(device).type not in FUSED_SCORES or n_text == 0 or n_scored != n_text:
        return []
    stop = scored_layers.stop
    return [layer for layer in scored_layers if not (trimmed and layer == stop - 1)]


@torch.no_grad()
def stale_steps(
    adapter: VLMAdapter,
    cache: KVCache,
    embeds: torch.Tensor,
    position_ids: torch.Tensor,
    text_rows: torch.Tensor,
    question_rows: torch.Tensor,
    n_keys: int,
    config: ScoreConfig | None = None,
    keep_probs: bool = False,
    last_only: bool = False,
    n_prompt: int = 0,
    group: int = 0,
) -> Generator[str, None, StaleScores]:
    """Run `text_rows` over the cache (embeds (N, hidden), position_ids (P, N)) and reduce
    the attention of `question_rows` (a subset of text_rows, the last `n_prompt` of them the
    generation prompt) layer by layer, yielding "scoring" after each group of `group`
    layers but the last (`conduit_core.passes.layer_groups`). The pass stops after the
    last scored layer (`pass_layers`); where that is before the model's last layer, the
    text rows' K/V at the later layers are not written and no last-layer states are handed
    on (`StaleScores.text_hidden` None)."""
    config = config or ScoreConfig()
    device = adapter.device
    host_text, host_question = text_rows, question_rows  # the layout's, on the host
    text_rows = text_rows.to(device)
    question_rows = question_rows.to(device)
    heads = adapter.text_config.num_attention_heads
    kv_heads = cache.keys.shape[2]
    rep = heads // kv_heads
    acc = ScoreAccumulator(config, len(adapter.layers), question_rows.numel(), n_keys, device,
                           n_prompt)
    host_scored = host_question[acc.rows]  # (Q',)
    pick = torch.searchsorted(host_text, host_scored)  # (Q',) places inside text_rows
    scored_rows = host_scored.to(device)  # (Q',)
    n_q = scored_rows.numel()
    # scored rows that are a run of text rows (the default: the tail) are a view of q
    run = int(pick[0]) if n_q and int(pick[-1] - pick[0]) + 1 == n_q else None
    pick = pick.to(device)
    chunk = max(1, SCORE_CHUNK_ELEMENTS // (heads * n_keys))
    # keys before the earliest scored row are visible to every scored row: only the columns
    # from there on need the causal mask
    first = int(host_scored.min()) if n_q else n_keys
    n_layers = len(adapter.layers)
    stop = pass_layers(config, n_layers)
    trimmed = trimmed_last(config, n_layers, last_only) and text_rows.numel() > 0
    fused = fused_layers(acc.layers, n_q, text_rows.numel(), trimmed, device)
    starts = range(0, n_q, chunk)
    # where small, each chunk's mask over all keys is made once for all layers and added by
    # the QK^T call itself; else the columns from `first` on are masked in each layer
    once = rep * n_q * n_keys <= SCORE_CHUNK_ELEMENTS
    masks = [_chunk_mask(scored_rows[s:s + chunk], 0, n_keys, rep) for s in starts] \
        if once else []
    mean = config.head_agg == "mean"
    kept: list[torch.Tensor] = []

    def observe(layer: int, q: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor) -> torch.Tensor | None:
        if layer not in acc.layers or n_q == 0:
            return None
        scaling = adapter.layers[layer].self_attn.scaling
        k = keys[0].float().transpose(1, 2)  # (G, hd, N): query head h reads KV head h // rep
        sums, norms = acc.slots(layer, heads, kv_heads)  # (H, N), (G, N) float32
        if not mean:  # "mean" takes every scored layer's norms in one call after the pass
            torch.linalg.vector_norm(values[0], dim=-1, dtype=torch.float32, out=norms)
        v = values[0].float() if layer in fused else None  # (G, N, hd)
        layer_probs, mixed = [], []
        for i, start in enumerate(starts):
            rows = scored_rows[start:start + chunk]  # (c,)
            c = rows.numel()
            qq = (q[0, :, run + start:run + start + c] if run is not None
                  else q[0, :, pick[start:start + chunk]])  # (H, c, hd)
            # float32 and folded for GQA in one copy: query head h = g * rep + j
            folded = torch.empty(kv_heads, rep * c, qq.shape[-1], device=device)
            folded.view(heads, c, -1).copy_(qq)  # (G, rep*c, hd)
            if once:  # scaled QK^T plus the mask, in one call
                scores = torch.baddbmm(masks[i], folded, k, alpha=scaling)  # (G, rep*c, N)
            else:
                scores = torch.baddbmm(torch.empty(kv_heads, rep * c, n_keys, device=device),
                                       folded, k, beta=0.0,
                                       alpha=scaling)  # (G, rep*c, N) scaled QK^T
                scores[:, :, first:].add_(_chunk_mask(rows, first, n_keys, rep))
            probs = torch.softmax(scores, dim=-1).view(heads, c, n_keys)  # (H, c, N)
            if not mean:
                acc.add(probs, norms)
            elif i == 0:
                torch.sum(probs, dim=1, out=sums)  # (H, N)
            else:
                sums.add_(probs.sum(dim=1))
            if v is not None:  # the rows' attention output, GQA as in the scores
                out = torch.bmm(probs.view(kv_heads, rep * c, n_keys), v)  # (G, rep*c, hd)
                mixed.append(out.view(heads, c, -1))  # (H, c, hd)
            if keep_probs:
                layer_probs.append(probs)
        if keep_probs:
            kept.append(torch.cat(layer_probs, dim=1))  # (H, Q', N)
        if v is None:
            return None
        out = mixed[0] if len(mixed) == 1 else torch.cat(mixed, dim=1)  # (H, R, hd)
        # in the layer's dtype and in the (rows, heads) order its output projection reads,
        # in one copy (a transposed view would be copied again by the layer's reshape)
        attended = torch.empty(1, out.shape[1], heads, out.shape[2], dtype=q.dtype,
                               device=device)  # (1, R, H, hd)
        attended[0].copy_(out.transpose(0, 1))
        return attended

    hidden = embeds[text_rows].unsqueeze(0)  # (1, N_t, hidden)
    pos = position_ids[:, host_text].unsqueeze(1)  # (P, 1, N_t)
    outputs = torch.tensor([text_rows.numel() - 1]) if trimmed else None
    setup = setup_rows(adapter, hidden.dtype, host_text, pos, n_keys=n_keys)  # every call's
    after_first = None
    groups = layer_groups(range(stop), group)
    for g in groups:
        if g.start == 0 and n_layers > 1:  # layer 0 alone first, to keep its output
            hidden = forward_rows(adapter, cache, hidden, text_rows, pos, n_keys=n_keys,
                                  observer=observe, layers=range(1),
                                  setup=setup)  # (1, N_t, hidden)
            after_first = hidden[0]
            g = range(1, g.stop)
        if len(g):  # the last layer's output only for the rows read (`outputs`)
            hidden = forward_rows(adapter, cache, hidden, text_rows, pos, n_keys=n_keys,
                                  observer=observe, layers=g, setup=setup,
                                  outputs=outputs if g.stop == stop
                                  else None)  # (1, N_t | 1, hidden)
        if g.stop < stop:
            yield "scoring"
    out = hidden if stop == n_layers else None  # (1, N_t | 1, hidden)
    if mean and n_q and len(acc.layers):  # a layer's values are final once it has run
        scored = slice(acc.layers.start, acc.layers.stop, acc.layers.step)
        torch.linalg.vector_norm(cache.values[scored, 0, :, :n_keys], dim=-1,
                                 dtype=torch.float32,
                                 out=acc.all_norms(heads, kv_heads))  # (L', G, N)
    weighted, attention = acc.result()
    return StaleScores(weighted=weighted, attention=attention, config=config,
                       question_rows=question_rows, text_rows=host_text,
                       text_hidden=None if out is None else out[0],
                       after_first=after_first, probs=torch.stack(kept) if kept else None)


def _chunk_mask(rows: torch.Tensor, first: int, n_keys: int, rep: int) -> torch.Tensor:
    """Additive causal mask (rep * c, n_keys - first) of scored rows `rows` (c,) over the
    keys from `first` on, repeated for the `rep` query heads of a KV head (their order in
    the folded scores): -inf where a key comes after the row."""
    keys = torch.arange(first, n_keys, device=rows.device)  # (N - first,)
    hidden = keys.view(1, -1) > rows.view(-1, 1)  # (c, N - first)
    mask = torch.zeros(hidden.shape, dtype=torch.float32, device=rows.device)
    return mask.masked_fill_(hidden, float("-inf")).repeat(rep, 1)  # (rep*c, N - first)


def text_from_layer_one(adapter: VLMAdapter, cache: KVCache, stale: StaleScores,
                        embeds: torch.Tensor, positions: torch.Tensor, n_rows: int,
                        text: torch.Tensor, text_places: torch.Tensor, fresh: torch.Tensor,
                        fresh_places: torch.Tensor, n_keys: int,
                        setup: RowSetup | None = None) -> torch.Tensor:
    """The inputs of decoder layer 1 of a refresh's `n_rows` rows (1, R, hidden), in the
    places given: rows `fresh` (F,) (visual rows and stale labels, on the device) run through
    layer 0 now, over a layer-0 cache that is exact, into `fresh_places`; rows `text` (T,)
    (on the host, among `stale.text_rows`) are `stale.after_first` (their layer 0 ran over
    the same keys in the scoring pass), into `text_places`. Nothing is read back: the rows
    the device chose stay there. The caller runs every row from layer 1 on; `positions`:
    the layout's (P, N) on the device; `setup`: the rows' `RowSetup` (the fresh rows' is
    taken from it)."""
    assert stale.after_first is not None
    out = torch.empty(1, n_rows, embeds.shape[-1], dtype=embeds.dtype,
                      device=embeds.device)  # (1, R, hidden)
    if fresh.numel():
        pos = positions[:, fresh].unsqueeze(1)  # (P, 1, F)
        sub = None if setup is None else setup.subset(adapter, fresh_places, n_keys)
        out[:, fresh_places] = forward_rows(
            adapter, cache, embeds[fresh].unsqueeze(0), fresh, pos, n_keys=n_keys,
            layers=range(1), setup=sub).to(out.dtype)  # (1, F, hidden)
    if text.numel():
        place = np.searchsorted(stale.text_rows.numpy(), text.numpy())  # (T,) in text_rows
        out[:, text_places] = stale.after_first[
            torch.from_numpy(place).to(out.device)].to(out.dtype)  # (1, T, hidden)
    return out
