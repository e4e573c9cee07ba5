"""Tensor helpers that turn per-token scores into a refreshed set (shared by the policies).

Positions here index the visual tokens in layout order (0 .. N_v - 1); `page_of` (N_v,) gives
each one's page number. Policies map positions to sequence indices with `visual_rows[pos]`.

Public API:
  budget_tokens(budget, n) -> int                 round(budget * n) clamped to [0, n]
  topk_positions(scores, k) -> (k,)               highest scores, ties to the lower position
  page_totals(scores, page_of, n_pages) -> (M,)   R_m = sum of scores on page m
  page_amplification(scores, page_of, n_pages, gamma) -> (M,)
                                    c_m = (R_m / mean R)^gamma
  mass_k(scores, mass, k_max) -> int   fewest top tokens holding `mass` of the score mass
  quota_split(sizes, k, weights=None) -> (M,)     k split over pages (largest remainder)
  per_page_topk(scores, page_of, quotas) -> positions   top quotas[m] of each page
  first_per_page(page_of, counts) -> positions    the first counts[m] tokens of each page
"""

from __future__ import annotations

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


def mass_k(scores: torch.Tensor, mass: float, k_max: int) -> int:
    """The fewest highest-scoring tokens whose scores (N,), non-negative, sum to at least
    `mass` of the total, at most `k_max` (and `k_max` when every score is 0)."""
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass must be in (0, 1], got {mass}")
    total = float(scores.sum())
    if total <= 0 or k_max <= 0:
        return max(0, k_max)
    top = torch.sort(scores.float(), descending=True).values[:k_max]  # (k_max,)
    reached = torch.nonzero(top.cumsum(0) >= mass * total)  # (r, 1)
    return int(reached[0, 0]) + 1 if reached.numel() else min(k_max, int(scores.numel()))


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
    totals = page_totals(scores, page_of, n_pages)  # (M,)
    mean = totals.mean() if n_pages else torch.tensor(0.0)
    if n_pages <= 1 or gamma == 0 or float(mean) <= 0:
        return ones
    return (totals / mean).clamp_min(0.0) ** gamma


def quota_split(sizes: torch.Tensor, k: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Split k tokens over pages of `sizes` (M,) in proportion to `weights` (default: the
    sizes), largest remainder first (ties to the lower page), never more than a page holds.
    Returns (M,) int64 summing to min(k, sizes.sum())."""
    sizes = sizes.to(torch.long).cpu()
    w = (sizes if weights is None else weights).to(torch.float64).cpu()
    k = min(k, int(sizes.sum()))
    quota = torch.zeros_like(sizes)
    while int(quota.sum()) < k:
        room = sizes - quota  # (M,)
        active = room > 0
        left = k - int(quota.sum())
        share = torch.where(active, w, torch.zeros_like(w))
        if float(share.sum()) <= 0:
            share = active.to(torch.float64)
        ideal = share / share.sum() * left  # (M,)
        add = torch.minimum(ideal.floor().to(torch.long), room)
        if int(add.sum()) == 0:  # hand out single tokens by largest remainder
            rem = torch.where(active, ideal - ideal.floor(), torch.full_like(ideal, -1.0))
            add = torch.zeros_like(quota)
            add[int(torch.sort(-rem, stable=True).indices[0])] = 1
        quota += add
    return quota


def per_page_topk(scores: torch.Tensor, page_of: torch.Tensor,
                  quotas: torch.Tensor) -> torch.Tensor:
    """Positions of the top `quotas[m]` scores within each page m, ascending."""
    picked = []
    for m, q in enumerate(quotas.tolist()):
        pos = torch.nonzero(page_of == m).view(-1)  # (T_m,)
        picked.append(pos[topk_positions(scores[pos], int(q))])
    return torch.cat(picked).sort().values if picked else torch.zeros(0, dtype=torch.long)


def first_per_page(page_of: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Positions of the first `counts[m]` tokens of each page m, ascending."""
    picked = [torch.nonzero(page_of == m).view(-1)[:int(c)] for m, c in enumerate(counts.tolist())]
    return torch.cat(picked).sort().values if picked else torch.zeros(0, dtype=torch.long)
