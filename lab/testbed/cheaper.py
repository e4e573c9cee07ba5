"""Candidates for a cheaper default (issue 67): the default's per-page quota, spending less of
it where a question's attention is concentrated.

Each is `conduit_per_page` (CONDUIT's scores, no amplification, each page's share of k by its
size: `quota_split`) with each page's count chosen from the scores, never above its quota, so
the request's budget stays the cap on the refresh and on its FLOPs; the runtime charges the
scoring pass and the refresh as for any policy. A count rule is a function
(scores (n,), cap) -> count in [0, cap], applied either to each page's own scores with its
quota as the cap (`each_page=True`), or once to the whole question's scores with k as the cap,
that count then split over the pages by the same quota rule (`each_page=False`):

  MassCount    the fewest top scores holding `mass` of the scores' total (as `conduit_adaptive`)
  KneeCount    the knee of the sorted top `cap` scores: the count where their cumulative share
               runs furthest above the diagonal (Kneedle); where it runs less than `prominence`
               above it (flat scores, diffuse attention) the cap

With flat scores (random weights) both reach the cap, and the policy is `conduit_per_page`.
The count is read back from the scores (a host read, as `conduit_focus`'s one).

`cv_mass_floor_30` / `_50` are `conduit_focus`'s rule without its boundary rows
(`conduit_core.policies.conduit_focus.FocusPolicy(floor=0.3 or 0.5, boundary=0)`): each page
refreshes max(its quota of floor * k rounded down, how many of the question's top m tokens it
holds), m the fewest holding half the scores' total (at most k); where those counts reach k,
each page's quota of k. `cv_floor_30_boundary_64` (`lab.testbed.variants`) is
`conduit_focus` itself, chosen by these rounds (not the default: docs/DECISIONS.md).

`ReadLabels(base, labels)` is `base` with the runtime's `label_refresh="read"` recomputing
`labels` stale labels instead of `READ_LABELS` (a lab knob: it sets the answer's
`Layout.read_labels` when the cost model asks for its profile, before anything reads it).
Results on the development seed: `lab/testbed/NOTES.md` ("Cheaper default").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from conduit_core.policies.conduit import ConduitChoice, ConduitConfig, ConduitPolicy
from conduit_core.policies.conduit_focus import FocusPolicy, mass_count
from conduit_core.policies.policy_context import PolicyContext, PolicyCost
from conduit_core.policies.selection import per_page_topk, quota_split

CountRule = Callable[[torch.Tensor, int], int]


@dataclass(frozen=True)
class MassCount:
    """The fewest top scores holding `mass` of the total (`mass_count`), at most the cap."""

    mass: float

    def __call__(self, scores: torch.Tensor, cap: int) -> int:
        """The count for scores (n,) under `cap`."""
        return mass_count(scores.float().numpy(), self.mass, cap)


def knee_k(scores: torch.Tensor, k_max: int, prominence: float) -> int:
    """The knee of the top `k_max` scores (N,), non-negative, sorted: the count i + 1 where
    their cumulative share y_i runs furthest above the diagonal (i + 1) / k_max; `k_max`
    where that distance is below `prominence` or every score is 0."""
    if k_max <= 1:
        return max(0, k_max)
    top = torch.sort(scores.float(), descending=True).values[:k_max]  # (k,)
    total = float(top.sum())
    if total <= 0:
        return k_max
    k = int(top.numel())
    share = top.cumsum(0) / total  # (k,)
    gap = share - torch.arange(1, k + 1, dtype=torch.float32) / k  # (k,)
    best = int(gap.argmax())
    return best + 1 if float(gap[best]) >= prominence else k_max


@dataclass(frozen=True)
class KneeCount:
    """`knee_k` at `prominence`: the knee of the sorted scores, the cap where there is none."""

    prominence: float

    def __call__(self, scores: torch.Tensor, cap: int) -> int:
        """The count for scores (n,) under `cap`."""
        return knee_k(scores, cap, self.prominence)


@dataclass(frozen=True)
class CountedPerPage(ConduitPolicy):
    """`conduit_per_page` with each page's count from `count`, capped by its quota (module
    docstring)."""

    count: CountRule = field(default=MassCount(0.5))
    each_page: bool = True
    config: ConduitConfig = field(default_factory=lambda: ConduitConfig(gamma=0.0,
                                                                        per_page=True))

    def counts(self, ctx: PolicyContext, scores: torch.Tensor) -> torch.Tensor:
        """Each page's count (M,) int64 for the scores (N_v,): the rule under its quota."""
        page_of = ctx.page_of_visual  # (N_v,)
        sizes = torch.bincount(page_of, minlength=ctx.num_pages)  # (M,)
        if not self.each_page:
            return quota_split(sizes, self.count(scores.cpu(), ctx.k))
        quotas = quota_split(sizes, ctx.k)  # (M,)
        host = scores.cpu()  # (N_v,)
        return torch.tensor([self.count(host[page_of == m], int(q)) if q else 0
                             for m, q in enumerate(quotas.tolist())], dtype=torch.long)

    def explain(self, ctx: PolicyContext) -> ConduitChoice:
        """Score as `conduit_per_page`, then each page's top `counts` tokens."""
        rows, scores, c = self.amplified(ctx)
        pos = per_page_topk(scores, ctx.page_of_visual, self.counts(ctx, scores))
        return ConduitChoice(rows=rows[pos], scores=scores, amplification=c)


@dataclass(frozen=True)
class ReadLabels:
    """`base` with `labels` stale labels recomputed under label_refresh "read"."""

    base: ConduitPolicy
    labels: int

    def cost_profile(self, ctx: PolicyContext) -> PolicyCost:
        """`base`'s profile, the layout's read count set first (the plan reads it)."""
        ctx.layout.read_labels = self.labels
        return self.base.cost_profile(ctx)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """`base`'s choice (the refresh then takes `labels` labels)."""
        ctx.layout.read_labels = self.labels
        return self.base(ctx)


CHEAPER: dict[str, ConduitPolicy | ReadLabels] = {
    "cv_page_mass_50": CountedPerPage(count=MassCount(0.5)),
    "cv_quota_mass_50": CountedPerPage(count=MassCount(0.5), each_page=False),
    "cv_quota_mass_70": CountedPerPage(count=MassCount(0.7), each_page=False),
    "cv_page_knee": CountedPerPage(count=KneeCount(0.25)),
    "cv_quota_knee": CountedPerPage(count=KneeCount(0.25), each_page=False),
    "cv_mass_floor_30": FocusPolicy(floor=0.3, boundary=0),
    "cv_mass_floor_50": FocusPolicy(floor=0.5, boundary=0),
}
CHEAPER |= {  # one label read instead of two (`ReadLabels`; run with label_refresh "read")
    "cv_quota_mass_50_read1": ReadLabels(CountedPerPage(count=MassCount(0.5),
                                                        each_page=False), 1),
    "cv_page_knee_read1": ReadLabels(CountedPerPage(count=KneeCount(0.25)), 1),
}
