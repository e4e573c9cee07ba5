"""`conduit_focus`, a product policy (not the default: docs/DECISIONS.md): `conduit_per_page`'s
scores, refreshing fewer tokens where the question's attention is concentrated, never more
than the request's k.

The contract, for k = `PolicyContext.k` with 0 < k < N_v (otherwise as every CONDUIT
policy: none, or every visual token, with no scoring pass):

* score as `conduit_per_page` (its `ScoreConfig`, depth `conduit_per_page.DEPTH`, gamma 0)
  and read the N_v visual scores to the host once: the one host read of the answer's
  prefill, by design (the counts below are decided by the scores; everything after it is host
  arithmetic on that copy, the boundary included);
* m = the fewest top tokens holding `MASS` of the scores' total (at most k: `mass_count`);
  each page's count = max(its quota (`quota_split`) of floor(`FLOOR` * k), how many of the
  top m it holds) (`focus_counts`);
* where those counts sum to k or more (diffuse attention: random weights, the embedded
  default), exactly `conduit_per_page`'s choice at k, decided on the device as it decides
  it: the same tokens and the same FLOPs, no boundary rows;
* otherwise each page's top `count` tokens and, where that choice holds a page's first
  token (after its opening delimiter), the last `BOUNDARY` tokens of the page shown before it
  (before its closing delimiter) on top (`boundary_rows`), never more than k rows in all:
  the focused choice kept whole where both fit, else that choice at the budget left
  (`within_cap`).

Why: a question that reads one record spends its attention on a few tokens, and refreshing
the rest of k buys no answers; the floor keeps every page some of its quota (a legend's
rows are read only through the page's structure), and a split record's key reads the value
ending the page before among that page's last rows, stale unless refreshed with it
(lab/testbed/NOTES.md, "A floor and the page boundary", and docs/DECISIONS.md, "`conduit_focus`
refreshes what the question focuses on").

Cost: the cost model charges the scoring pass at this depth and predicts the refresh at the
share of k earlier answers refreshed (`conduit_core.cost.choice_history`; k itself with no
history), deciding the fallback on k rows (`PolicyCost.k` is the cap): the plan, and so the
answer, does not depend on that history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.conduit import ConduitChoice, ConduitConfig, ConduitPolicy
from conduit_core.policies.conduit_per_page import DEPTH
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.policies.selection import per_page_topk, quota_split
from conduit_core.prompt.layout import Segment

MASS = 0.5  # the share of the scores' total the top m tokens hold
FLOOR = 0.3  # each page's least count: its quota of this share of k
BOUNDARY = 64  # rows of the page before refreshed where a page's first token is chosen


def mass_count(scores: np.ndarray, mass: float, k: int) -> int:
    """The fewest highest scores (N,), non-negative, holding at least `mass` of their total
    (float64 sums), at most `k`; `k` where every score is 0 or the mass is not reached."""
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass must be in (0, 1], got {mass}")
    values = scores.astype(np.float64)
    total = float(values.sum())
    if total <= 0 or k <= 0:
        return max(0, k)
    neg = -values  # (N,)
    if k < neg.size:
        neg = np.partition(neg, k - 1)[:k]  # (k,) the k best, negated, unordered
    top = -np.sort(neg)  # (<= k,) best first
    reached = np.flatnonzero(np.cumsum(top) >= mass * total)
    return int(reached[0]) + 1 if reached.size else min(k, values.size)


def focus_counts(scores: np.ndarray, page_of: np.ndarray, n_pages: int, k: int,
                 floor: float = FLOOR, mass: float = MASS) -> np.ndarray | None:
    """Each of `n_pages` pages' count (M,) int64 for the host scores (N_v,) of pages
    `page_of` (N_v,): max(its quota of floor(floor * k), its part of the top `mass_count`
    tokens); None where those counts reach k (the quota of k is the choice then)."""
    m = mass_count(scores, mass, k)
    if m >= k:  # the pages' parts of the top m alone reach k
        return None
    sizes = np.bincount(page_of, minlength=n_pages)  # (M,)
    held_rows = np.argsort(-scores, kind="stable")[:m]  # (m,)
    held = np.bincount(page_of[held_rows], minlength=sizes.size)  # (M,)
    least = quota_split(torch.from_numpy(sizes), int(floor * k)).numpy()  # (M,)
    counts = np.maximum(least, held)  # (M,)
    return None if int(counts.sum()) >= k else counts


def boundary_rows(segments: Sequence[Segment], chosen: set[int], tokens: int) -> list[int]:
    """The rows before each page whose first token (after its opening delimiter) is among
    `chosen`: the last `tokens` tokens of the page shown before it, before its closing
    delimiter, nearest their page's end first."""
    ends: list[tuple[int, int]] = []  # (tokens before its page's end, row)
    for before, page in zip(segments, segments[1:], strict=False):
        if page.start + 1 in chosen:
            end = before.stop - 1  # its closing delimiter
            ends += [(end - r, r) for r in range(max(before.start + 1, end - tokens), end)]
    return [r for _, r in sorted(ends)]


def within_cap(chosen: torch.Tensor, extra: list[int], k: int,
               fewer: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """`chosen` (host rows) with the rows `extra` (nearest first) on top, at most `k` in all:
    the k nearest of `extra`; where they do not fit beside `chosen`, `fewer(budget)` (the same
    rule's choice at a smaller budget) for the room left, first counting the rows `chosen`
    already holds. Ascending (<= k,)."""
    picked = set(chosen.tolist())
    extra_set = set(extra[:k])
    if not extra_set:
        return chosen
    if len(picked | extra_set) <= k:
        return torch.tensor(sorted(picked | extra_set), dtype=torch.long)
    rows = chosen
    for keep in (k - len(extra_set - picked), k - len(extra_set)):
        rows = torch.tensor(sorted(set(fewer(keep).tolist()) | extra_set), dtype=torch.long)
        if rows.numel() <= k:  # the second always fits
            break
    return rows


@dataclass(frozen=True)
class FocusPolicy(ConduitPolicy):
    """`conduit_per_page` with each page's count from the scores' mass and a floor, and the
    page boundary on top, within k (module docstring); `boundary` 0: no boundary rows."""

    floor: float = FLOOR
    mass: float = MASS
    boundary: int = BOUNDARY
    config: ConduitConfig = field(default_factory=lambda: ConduitConfig(
        gamma=0.0, score=ScoreConfig(layers=DEPTH), per_page=True))
    fixed: frozenset[str] = frozenset({"gamma"})

    def focused(self, ctx: PolicyContext, scores: np.ndarray, k: int) -> torch.Tensor | None:
        """The focused choice at `k` (host rows, ascending) from the host scores (N_v,), the
        boundary not added; None where the counts reach k."""
        if k <= 0:
            return torch.zeros(0, dtype=torch.long)
        page_of = ctx.page_of_visual  # (N_v,) host
        counts = focus_counts(scores, page_of.numpy(), ctx.num_pages, k, self.floor,
                              self.mass)  # (M,)
        if counts is None:
            return None
        pos = per_page_topk(torch.from_numpy(scores), page_of, torch.from_numpy(counts))
        return ctx.visual_rows[pos]  # (<= k,)

    def at_budget(self, ctx: PolicyContext, scores: np.ndarray, k: int) -> torch.Tensor:
        """The choice at `k` without the boundary, on the host: focused, or the quota of k."""
        chosen = self.focused(ctx, scores, k)
        if chosen is not None:
            return chosen
        page_of = ctx.page_of_visual  # (N_v,)
        quotas = quota_split(torch.bincount(page_of, minlength=ctx.num_pages), k)  # (M,)
        return ctx.visual_rows[per_page_topk(torch.from_numpy(scores), page_of, quotas)]

    def explain(self, ctx: PolicyContext) -> ConduitChoice:
        """Score as `conduit_per_page`, read the scores once, then the rule (module
        docstring): the rows are on the host where focused, on the device where diffuse."""
        rows, scores, c = self.amplified(ctx)  # (N_v,), (N_v,) on the device
        host = scores.float().cpu().numpy()  # (N_v,) the one host read
        k = ctx.k
        chosen = self.focused(ctx, host, k)
        if chosen is None:  # diffuse: conduit_per_page's choice, on the device
            return ConduitChoice(rows=rows[self.positions(ctx, scores, k)], scores=scores,
                                 amplification=c)
        if self.boundary > 0:
            extra = boundary_rows(ctx.layout.segments, set(chosen.tolist()), self.boundary)
            chosen = within_cap(chosen, extra, k, lambda keep: self.at_budget(ctx, host, keep))
        return ConduitChoice(rows=chosen, scores=scores, amplification=c)


select = FocusPolicy()
