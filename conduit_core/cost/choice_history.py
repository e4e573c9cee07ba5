"""Where a scoring policy's refreshed tokens fell in recent answers: the cost model's prior.

A policy that chooses from a forward pass (CONDUIT, raw attention, CacheBlend, ...) is costed
before that pass runs (`conduit_core.cost.cost_model`). The linear part of its refresh cost is
exact (k rows), but the attention part depends on where the k rows lie: a row late in the
prompt reads more keys, and rows spread thinly waste more keys per attention block than rows
that cluster. Placing the k rows evenly over the visual tokens overestimates the cost of a
choice that gathers early and clusters, as CONDUIT's does.

This history keeps, per key (the runtime's: policy, options and budget), a histogram of the
chosen tokens' places among the visual tokens (the fraction of visual tokens before each, in
`BINS` bins, an exponential moving average over answers) and places the next prediction's k
rows at its quantiles. With no history for a key the placement is even (measured:
docs/DECISIONS.md, "The cost estimate learns where a policy's choices fall"). A policy that
chooses its own k under the budget's cap (a budget per question) is also predicted at the
share of the cap it refreshed in earlier answers (an average like the histogram's; the cap
itself with no history). Bounded: at most `capacity` keys, least
recently used dropped.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np
import torch
from numpy.typing import ArrayLike

BINS = 64


def even_rows(visual_rows: torch.Tensor, k: int) -> torch.Tensor:
    """`k` of `visual_rows` spread evenly from the first to the last: (k,)."""
    n = visual_rows.numel()
    if k <= 0 or n == 0:
        return visual_rows[:0]
    if k >= n:
        return visual_rows
    pick = torch.linspace(0, n - 1, k).round().to(torch.long)  # (k,)
    return visual_rows[pick]


def quantile_rows(visual_rows: torch.Tensor, k: int, histogram: ArrayLike) -> torch.Tensor:
    """`k` distinct rows of `visual_rows` (ascending) at the quantiles of `histogram`
    (BINS,) over their fractional index: (k,) ascending. Host arithmetic (numpy)."""
    n = visual_rows.numel()
    if k <= 0 or n == 0:
        return visual_rows[:0]
    if k >= n:
        return visual_rows
    hist = np.asarray(histogram, dtype=np.float64)  # (BINS,)
    cdf = np.cumsum(hist) / hist.sum()  # (BINS,)
    targets = (np.arange(k, dtype=np.float64) + 0.5) / k  # (k,)
    bins = np.minimum(np.searchsorted(cdf, targets), len(cdf) - 1)  # (k,)
    below = np.concatenate([[0.0], cdf])[bins]  # (k,) mass before each bin
    inside = (targets - below) / np.maximum(cdf[bins] - below, 1e-12)  # (k,) in [0, 1]
    frac = (bins + np.clip(inside, 0.0, 1.0)) / len(cdf)  # (k,)
    idx = np.round(frac * (n - 1)).astype(np.int64)  # (k,) nondecreasing
    steps = np.arange(k)
    idx = np.maximum.accumulate(idx - steps) + steps  # strictly increasing
    idx = np.minimum(idx, n - k + steps)  # and within range: still strictly increasing
    return visual_rows[torch.from_numpy(idx)]  # host rows, a host index


class ChoiceHistory:
    """Per-key histograms of where chosen tokens lay (see the module docstring)."""

    def __init__(self, capacity: int = 64, weight: float = 0.5):
        if capacity < 1 or not 0.0 < weight <= 1.0:
            raise ValueError("capacity must be >= 1 and weight in (0, 1]")
        self.capacity = capacity
        self.weight = weight  # the newest answer's share of the average
        self._hist: OrderedDict[Hashable, tuple[np.ndarray, float]] = OrderedDict()
        self._lock = threading.Lock()

    def rows(self, key: Hashable, visual_rows: torch.Tensor, k: int) -> torch.Tensor:
        """The rows a prediction for `key` places, at most `k` (the cap): the share of the
        cap earlier answers refreshed, at the history's quantiles; with no history, k rows
        evenly. Ascending."""
        with self._lock:
            entry = self._hist.get(key)
            if entry is not None:
                self._hist.move_to_end(key)
        if entry is None or entry[0].sum() <= 0.0:
            return even_rows(visual_rows, k)
        hist, share = entry
        return quantile_rows(visual_rows, min(k, max(1, round(share * k))) if k > 0 else 0,
                             hist)

    def record(self, key: Hashable, visual_rows: torch.Tensor, chosen: torch.Tensor,
               cap: int | None = None) -> None:
        """Add one answer's choice `chosen` (a subset of `visual_rows`, both ascending), of
        at most `cap` rows (None: the choice is the cap)."""
        n = visual_rows.numel()
        if n == 0 or chosen.numel() == 0:
            return
        share = 1.0 if not cap else min(1.0, chosen.numel() / cap)
        place = np.searchsorted(visual_rows.cpu().numpy(),
                                chosen.to(torch.long).cpu().numpy())  # (k,)
        hist = np.histogram(place / n, bins=BINS, range=(0.0, 1.0))[0].astype(np.float64)
        hist /= hist.sum()  # (BINS,)
        w = self.weight
        with self._lock:
            old = self._hist.pop(key, None)
            self._hist[key] = (hist, share) if old is None else (
                (1 - w) * old[0] + w * hist, (1 - w) * old[1] + w * share)
            while len(self._hist) > self.capacity:
                self._hist.popitem(last=False)
