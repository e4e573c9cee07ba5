"""Grouped causal attention of a row subset over a KV cache (the sdpa fast path).

A subset of rows (sequence indices) attends over the cache with the exact causal rule "row r
sees keys 0..r". One sdpa call with an (R, N) mask makes every row read all N keys (no
kernel skips masked blocks given an arbitrary mask). Here the rows (ascending) are cut into
at most `groups` consecutive groups, each reading only the keys up to its last row, one sdpa
call per group (GQA by the kernel, `enable_gqa`: K/V are never repeated):
  * the number of calls is bounded by the device, not by the rows (`row_groups`): one per
    layer on an accelerator, where a call costs a launch whatever its size; at most four on
    the CPU, where the keys a row reads past its own cost time, and so does each call's own
    read of its keys (about `CALL_ROWS` rows' worth): the cuts, chosen among evenly spaced
    candidates, cost the least in all (`group_bounds`), so a run of rows that all sit near
    the end (a conversation's follow-up) takes one call, where a cut saves no keys;
  * one group reads every key under a mask built on the device from the rows, never reading
    them back: on an accelerator the rows may be the device's own choice (the refresh's), and
    a read would stall the launch queue and break a graph capture (issue 65); four groups are
    cut on the host, where the CPU reads its rows for free;
  * the groups and their additive masks (views of one (R, n) mask; None where every row
    sees every key of its group) are built once per forward and shared by all layers.
The result equals `F.scaled_dot_product_attention` over the full mask up to float rounding
(the masked keys contribute exact zeros either way); `layer_forward.computed_key_counts`
charges each row its group's key count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

ROW_GROUPS = {"cpu": 4}  # sdpa calls a layer for a masked subset, per device
DEFAULT_ROW_GROUPS = 1  # accelerators: one call a layer
CUT_CANDIDATES = 64
CALL_ROWS = 4.0  # a call's own read of its keys, in rows' reads of them (CPU, measured)


def row_groups(device: torch.device | str) -> int:
    """How many sdpa calls a masked subset takes a layer on `device`."""
    return ROW_GROUPS.get(torch.device(device).type, DEFAULT_ROW_GROUPS)


@dataclass(frozen=True)
class RowBlock:
    """Rows [start, stop) of the subset, which see keys [0, n_keys) under `mask`."""

    start: int
    stop: int
    n_keys: int
    mask: torch.Tensor | None  # (stop - start, n_keys) additive; None: every key seen


def causal_row_mask(rows: torch.Tensor, n_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (1, 1, R, n_keys): 0 where key index <= row index, else dtype min."""
    return additive_mask(rows, n_keys, dtype, rows.device).view(1, 1, -1, n_keys)


def additive_mask(rows: torch.Tensor, n_keys: int, dtype: torch.dtype,
                  device: torch.device | str) -> torch.Tensor:
    """Additive mask (R, n_keys) in `dtype` on `device`: 0 where a key's index is <= its
    row's (rows (R,)), dtype min where it comes after. Two operations: the key indices and
    the two fill values are made once per device (`_key_indices`, `_fills`)."""
    device = torch.device(device)
    later = key_indices(n_keys, device).view(1, -1) > rows.to(device).view(-1, 1)  # (R, n_keys)
    seen, hidden = _fills(dtype, device)
    return torch.where(later, hidden, seen)  # (R, n_keys)


def key_indices(n: int, device: torch.device) -> torch.Tensor:
    """arange(n) (n,) int64 on `device`: a view of one made once per power of two."""
    return _key_indices(1 << max(n - 1, 0).bit_length(), device)[:n]


@functools.lru_cache(maxsize=64)
def _key_indices(size: int, device: torch.device) -> torch.Tensor:
    return torch.arange(size, device=device)  # (size,) read-only by contract


@functools.lru_cache(maxsize=16)
def _fills(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """An additive mask's two values, 0 and dtype min, as 0-d tensors (read-only)."""
    return (torch.zeros((), dtype=dtype, device=device),
            torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device))


def group_bounds(rows: torch.Tensor, n_keys: int, groups: int) -> list[tuple[int, int, int]]:
    """At most `groups` runs of consecutive entries of `rows` (R,), as (start, stop, keys
    read = largest row of the run + 1, at most n_keys), cut where the runs cost the least
    in all among cuts at `CUT_CANDIDATES` evenly spaced places, a run costing its keys read
    by its rows and by its call (`CALL_ROWS` rows' worth); the most runs on a tie. One group
    reads all `n_keys` (its rows are never read: on an accelerator they may be a choice the
    device made, and reading them back would stall its queue). A pure function of its
    arguments, computed on the host in numpy (the FLOPs accounting calls it too, and it
    launches nothing on the device); the cuts are remembered for the keys read at the
    candidates (a forward and its accounting ask for the same rows several times)."""
    if groups < 1:
        raise ValueError("groups must be >= 1")
    if groups == 1:
        return [(0, int(rows.numel()), n_keys)] if rows.numel() else []
    host = rows.detach().cpu().numpy().astype(np.int64)  # (R,)
    r = int(host.size)
    if r == 0:
        return []
    limit = np.minimum(np.maximum.accumulate(host) + 1, n_keys)  # (R,) keys up to entry i
    lim = limit[np.maximum(_candidates(r) - 1, 0)]  # (C,) keys of a run ending at each
    return list(_least_cost(r, tuple(lim.tolist()), groups, CALL_ROWS))


@functools.lru_cache(maxsize=256)
def _candidates(r: int) -> np.ndarray:
    """The cut candidates of `r` rows: `CUT_CANDIDATES` evenly spaced places (C,), 0 and r
    included (read-only: shared by every call)."""
    cuts = np.unique(np.rint(np.linspace(0, r, CUT_CANDIDATES + 1)).astype(np.int64))
    cuts.flags.writeable = False
    return cuts


@functools.lru_cache(maxsize=1024)
def _least_cost(r: int, limits: tuple[int, ...], groups: int,
                call_rows: float) -> tuple[tuple[int, int, int], ...]:
    """`group_bounds` of `r` rows whose runs ending at each candidate read `limits` keys, a
    call costing `call_rows` rows' reads of its keys."""
    cuts = _candidates(r)  # (C,)
    lim = np.array(limits, dtype=np.float64)  # (C,)
    span = cuts.reshape(1, -1) - cuts.reshape(-1, 1)  # (C, C) rows of run (i, j)
    # (C, C) cost of run (i, j): its rows' keys, and its call's own read of its keys
    cost = np.where(span > 0, (span + call_rows) * lim.reshape(1, -1), np.inf)
    best = np.full(cuts.size, np.inf)  # (C,) least cost covering [0, cuts[j])
    best[0] = 0.0
    back, ends = [], []
    for _ in range(min(groups, cuts.size - 1)):  # k runs, k = 1, 2, ...
        total = best.reshape(-1, 1) + cost  # (C, C)
        back.append(total.argmin(axis=0))  # (C,) the best previous cut of each
        best = total.min(axis=0)
        ends.append(best[-1])
    k = len(ends) - int(np.argmin(ends[::-1]))  # the fewest cost, the most runs on a tie
    out, j = [], cuts.size - 1
    for came in reversed(back[:k]):
        i = int(came[j])
        out.append((int(cuts[i]), int(cuts[j]), int(lim[j])))
        j = i
    return tuple(out[::-1])


def row_blocks(rows: torch.Tensor, n_keys: int, groups: int, dtype: torch.dtype,
               device: torch.device | None = None) -> list[RowBlock]:
    """`group_bounds` runs of `rows` (R,), each with its key range and its additive mask in
    `dtype` (sdpa takes it as it is), built on `device` (default: the rows' device) in a few
    operations for all runs."""
    device = rows.device if device is None else device
    bounds = group_bounds(rows, n_keys, groups)
    out: list[RowBlock] = []
    if not bounds:
        return out
    if groups == 1:  # every key, under the mask (the rows stay where they are)
        return [RowBlock(0, bounds[0][1], n_keys, additive_mask(rows, n_keys, dtype, device))]
    host = rows.cpu()
    needs = [int(host[start:stop].min()) + 1 < limit  # some row misses a key of its group
             for start, stop, limit in bounds]
    mask = None
    if any(needs):
        mask = additive_mask(rows, max(limit for _, _, limit in bounds), dtype, device)
    for (start, stop, limit), masked in zip(bounds, needs, strict=True):
        part = mask[start:stop, :limit] if masked and mask is not None else None
        out.append(RowBlock(start, stop, limit, part))
    return out


def blocked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      blocks: list[RowBlock], scaling: float) -> torch.Tensor:
    """Attention of q (B, H, R, hd) over keys/values (B, G, N, hd) by `blocks` (one sdpa
    call each, GQA in the kernel); returns (B, R, H, hd) like transformers' attention
    functions (a view of one concatenation; of the one call's output for one block)."""
    parts = [F.scaled_dot_product_attention(
        q[:, :, blk.start:blk.stop], keys[:, :, :blk.n_keys], values[:, :, :blk.n_keys],
        attn_mask=blk.mask, scale=scaling, enable_gqa=True).transpose(1, 2)
        for blk in blocks]  # (B, c, H, hd) each
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # (B, R, H, hd)
