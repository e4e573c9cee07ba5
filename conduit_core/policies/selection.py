"""Tensor helpers that turn per-token scores into a refreshed set (shared by the policies).

Positions here index the visual tokens in layout order (0 .. N_v - 1); `page_of` (N_v,) gives
each one's page number. Policies map positions to sequence indices with `visual_rows[pos]`.
What they decide for every policy: a budget rounds to tokens one way (`budget_tokens`), equal
scores go to the lower position (a choice is deterministic), and a page's quota is its share
of k, by size unless weighted (`quota_split`).
"""

from __future__ import annotations

import numpy as np
import torch


def budget_tokens(budget: float, n: int) -> int:
    """k = round(budget * n) (Python rounding, as `PolicyContext.k`), clamped to [0, n]."""
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"budget must be in [0, 1], got {budget}")
    return max(0, min(n, round(budget * n)))


def topk_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k highest scores (N,), ascending; equal scores go to the lower
    position (a stable sort), so the choice is deterministic."""
    order = torch.sort(-scores.float(), stable=True).indices  # (N,) best first
    return order[:k].sort().values


def page_totals(scores: torch.Tensor, page_of: torch.Tensor, n_pages: int) -> torch.Tensor:
    """R_m = sum of `scores` (N_v,) over page m: (M,) float32."""
    totals = torch.zeros(n_pages, dtype=torch.float32, device=scores.device)
    return totals.index_add_(0, page_of.to(scores.device), scores.float())


def page_amplification(scores: torch.Tensor, page_of: torch.Tensor, n_pages: int,
                       gamma: float) -> torch.Tensor:
    """Image-level amplification c_m = (R_m / mean_m R_m)^gamma, (M,) float32, with R_m the
    sum of page m's scores.

    c = 1 for every page when there is one page, when gamma == 0, or when all R_m are 0.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    ones = torch.ones(n_pages, dtype=torch.float32, device=scores.device)
    if n_pages <= 1 or gamma == 0:
        return ones
    totals = page_totals(scores, page_of, n_pages)  # (M,)
    mean = totals.mean()  # decided on the device: never read back
    return torch.where(mean > 0, (totals / mean).clamp_min(0.0) ** gamma, ones)


def quota_split(sizes: torch.Tensor, k: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Split k tokens over pages of `sizes` (M,) in proportion to `weights` (M,) >= 0
    (default: the sizes), never more than a page holds. Returns (M,) int64 (on the host)
    summing to min(k, sizes.sum()).

    The rule, in rounds over the pages that still have room (their weights; equal ones when
    those weights are all 0): each gets floor(its share of the tokens left), at most its
    room; when that gives nothing (every share below one token), the tokens left go one at
    a time to the page with the largest remainder of its share (the lower page on a tie;
    with the shares unchanged that is the same page each time), re-deciding when a page
    fills up. A round is a fixed number of array operations (the single tokens of a round
    are decided together): rounds repeat while floors still hand out whole tokens or a page
    fills up, never once a page or once a token. Host arithmetic on M numbers: numpy, in
    float64 (no device work, no dispatch of tensor operations).
    """
    room_all = sizes.to(torch.long).cpu().numpy()  # (M,)
    w = (room_all if weights is None else weights.cpu().numpy()).astype(np.float64)  # (M,)
    k = min(k, int(room_all.sum()))
    quota = np.zeros_like(room_all)
    given = 0
    while given < k:
        room = room_all - quota  # (M,)
        active = room > 0
        left = k - given
        share = np.where(active, w, 0.0)
        if share.sum() <= 0:
            share = active.astype(np.float64)
        ratio = share / share.sum()  # (M,)
        add = np.minimum(np.floor(ratio * left).astype(np.int64), room)  # (M,)
        if add.sum() == 0:
            add = _single_tokens(ratio, active, room, left)
        quota += add
        given += int(add.sum())
    return torch.from_numpy(quota)


def _single_tokens(ratio: np.ndarray, active: np.ndarray, room: np.ndarray,
                   left: int) -> np.ndarray:
    """The tokens `quota_split` hands out one at a time while no page fills up (every share
    ratio[m] * tokens left below one), decided together: (M,) int64.

    Token j goes out with `left - j` tokens left, to the page of the largest remainder of
    ratio * (left - j) among the active pages (the first on a tie); the same float64
    products as one token a round, so the same pages. Stops after the token that fills a page
    (the shares change then)."""
    lefts = np.arange(left, 0, -1, dtype=np.float64)  # (S,) tokens left at each step
    ideal = ratio[None, :] * lefts[:, None]  # (S, M)
    rem = np.where(active[None, :], ideal - np.floor(ideal), -1.0)  # (S, M)
    winner = rem.argmax(axis=1)  # (S,) the first largest remainder of each step
    given = np.eye(ratio.size, dtype=np.int64)[winner]  # (S, M) one token a step
    full = (given.cumsum(0) >= room[None, :]) & active[None, :]  # (S, M)
    fills = full.any(axis=1)  # (S,) some page full after the step
    steps = int(fills.argmax()) + 1 if fills.any() else left
    return given[:steps].sum(0)  # (M,)


def _kept_in_page(order: torch.Tensor, page_of: np.ndarray, counts: np.ndarray,
                  device: torch.device) -> torch.Tensor:
    """Positions `order` (N,) sorted by page (stably), on `device`: the first `counts[m]`
    of each page m kept (page_of (N,) and counts (M,) on the host), ascending. Sorted by
    page, place i of `order` holds page p's (i - p's first place)-th entry whatever the
    scores, so the places kept follow from the host data alone: nothing is read back, and
    the device gathers them and sorts them (two operations)."""
    sizes = np.bincount(page_of, minlength=counts.size)  # (M,)
    firsts = np.repeat(sizes.cumsum() - sizes, sizes)  # (N,) first place of each's page
    rank = np.arange(page_of.size) - firsts  # (N,) rank within its page
    places = np.flatnonzero(rank < np.repeat(counts, sizes))  # (kept,) places kept
    return order[torch.from_numpy(places).to(device)].sort().values  # (kept,)


def per_page_topk(scores: torch.Tensor, page_of: torch.Tensor,
                  quotas: torch.Tensor) -> torch.Tensor:
    """Positions of the top `quotas[m]` scores (quotas (M,) >= 0) within each page m (page_of
    (N,) in [0, M)), ascending; equal scores go to the lower position, as `topk_positions`.
    One sort by score and one stable sort by page, whatever the number of pages, on the
    scores' device (`page_of` and `quotas`, the layout's, on the host)."""
    device = scores.device
    host_pages = page_of.to(torch.long).numpy()  # (N,)
    by_score = torch.sort(-scores.float(), stable=True).indices  # (N,) best first
    pages = torch.from_numpy(host_pages).to(device)  # (N,)
    order = by_score[torch.sort(pages[by_score], stable=True).indices]  # (N,) page, best
    return _kept_in_page(order, host_pages, quotas.to(torch.long).numpy(), device)


def first_per_page(page_of: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Positions of the first `counts[m]` tokens (counts (M,) >= 0) of each page m (page_of
    (N,) in [0, M)), ascending. One stable sort, whatever the number of pages."""
    host_pages = page_of.to(torch.long).numpy()  # (N,)
    order = torch.from_numpy(np.argsort(host_pages, kind="stable"))  # (N,) page, position
    return _kept_in_page(order, host_pages, counts.to(torch.long).numpy(), order.device)
