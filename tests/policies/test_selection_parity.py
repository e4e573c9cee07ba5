"""The vectorised selection helpers pick exactly what the loops they replaced picked.

`quota_split`, `per_page_topk` and `first_per_page` (`conduit_core.policies.selection`) and
`PolicyContext.page_of_visual` once looped over pages, or handed out tokens one at a time; the
loops are kept here, and only here, as the reference. Over random page sizes (empty pages
included), budgets from 0 to every token, integer and float weights (zero weights and ties
included) and scores with ties, the new functions return the same tensors, element for
element (the same token indices, ties broken the same way).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from conduit_core.policies.policy_context import PolicyContext
from conduit_core.policies.selection import (
    first_per_page,
    per_page_topk,
    quota_split,
    topk_positions,
)
from conduit_core.prompt.layout import Layout, Segment
from lab.ttft.op_count import OpCounter

CASES = 300


def _quota_split_loop(sizes: torch.Tensor, k: int,
                      weights: torch.Tensor | None = None) -> torch.Tensor:
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


def _per_page_topk_loop(scores: torch.Tensor, page_of: torch.Tensor,
                        quotas: torch.Tensor) -> torch.Tensor:
    picked = []
    for m, q in enumerate(quotas.tolist()):
        pos = torch.nonzero(page_of == m).view(-1)  # (T_m,)
        picked.append(pos[topk_positions(scores[pos], int(q))])
    return torch.cat(picked).sort().values if picked else torch.zeros(0, dtype=torch.long)


def _first_per_page_loop(page_of: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    picked = [torch.nonzero(page_of == m).view(-1)[:int(c)] for m, c in enumerate(counts.tolist())]
    return torch.cat(picked).sort().values if picked else torch.zeros(0, dtype=torch.long)


def _sizes(rng: random.Random) -> torch.Tensor:
    """1 to 40 pages: equal sizes, small ones, or large ones; some pages empty."""
    m = rng.randint(1, 40)
    kind = rng.choice(["equal", "small", "large"])
    if kind == "equal":
        sizes = [rng.choice([1, 7, 256])] * m
    elif kind == "small":
        sizes = [rng.randint(0, 6) for _ in range(m)]
    else:
        sizes = [rng.randint(0, 400) for _ in range(m)]
    return torch.tensor(sizes, dtype=torch.long)


def _weights(rng: random.Random, sizes: torch.Tensor) -> torch.Tensor | None:
    """None (the sizes), ones, integers with ties and zeros, or floats with zeros."""
    m = int(sizes.numel())
    kind = rng.choice(["none", "ones", "ints", "floats", "zeros"])
    if kind == "none":
        return None
    if kind == "ones":
        return torch.ones(m)
    if kind == "ints":
        return torch.tensor([rng.randint(0, 3) for _ in range(m)])
    if kind == "zeros":
        return torch.zeros(m)
    return torch.tensor([rng.choice([0.0, rng.random(), 1 / 3]) for _ in range(m)],
                        dtype=torch.float32)


def _k(rng: random.Random, n: int) -> int:
    """A budget from 0 to every token (sometimes more)."""
    budget = rng.choice([0.0, 1.0, 0.1, rng.random()])
    return round(budget * n) + (rng.randint(0, 3) if rng.random() < 0.1 else 0)


def _page_of(sizes: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(sizes.numel()), sizes)  # (N,)


def _scores(rng: random.Random, n: int) -> torch.Tensor:
    """Scores with ties: a few distinct values, or continuous ones with repeats."""
    gen = torch.Generator().manual_seed(rng.randint(0, 2**31))
    if rng.random() < 0.5:
        return torch.randint(0, 4, (n,), generator=gen).float() / 4
    s = torch.rand(n, generator=gen)
    if n:
        s[torch.randint(0, n, (n // 3,), generator=gen)] = float(s[0])
    return s


def test_quota_split_matches_the_loop() -> None:
    rng = random.Random(0)
    for _ in range(CASES):
        sizes = _sizes(rng)
        weights = _weights(rng, sizes)
        k = _k(rng, int(sizes.sum()))
        expected = _quota_split_loop(sizes, k, weights)
        got = quota_split(sizes, k, weights)
        assert got.dtype == expected.dtype and torch.equal(got, expected), \
            (sizes.tolist(), k, None if weights is None else weights.tolist())


def test_quota_split_by_hand() -> None:
    # 32 equal pages: 25 each, and the 19 left over go to the first page
    assert quota_split(torch.full((32,), 256), 819).tolist() == [44] + [25] * 31
    # a page that fills up passes the rest on
    assert quota_split(torch.tensor([1, 10]), 6, weights=torch.ones(2)).tolist() == [1, 5]
    assert quota_split(torch.tensor([0, 3, 0]), 5).tolist() == [0, 3, 0]
    assert quota_split(torch.zeros(0, dtype=torch.long), 4).tolist() == []


def test_per_page_topk_matches_the_loop() -> None:
    rng = random.Random(1)
    for _ in range(CASES):
        sizes = _sizes(rng)
        page_of = _page_of(sizes)
        scores = _scores(rng, int(page_of.numel()))
        if rng.random() < 0.5:
            quotas = _quota_split_loop(sizes, _k(rng, int(sizes.sum())))
        else:  # any quotas, some above a page's size
            quotas = torch.tensor([rng.randint(0, s + 2) for s in sizes.tolist()])
        expected = _per_page_topk_loop(scores, page_of, quotas)
        got = per_page_topk(scores, page_of, quotas)
        assert got.dtype == expected.dtype and torch.equal(got, expected), \
            (sizes.tolist(), quotas.tolist())


def test_per_page_topk_with_pages_out_of_order() -> None:
    page_of = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0])
    scores = torch.tensor([0.5, 0.5, 0.1, 0.9, 0.5, 0.7, 0.1, 0.5])
    quotas = torch.tensor([2, 1, 2])
    expected = _per_page_topk_loop(scores, page_of, quotas)
    assert per_page_topk(scores, page_of, quotas).tolist() == expected.tolist() == [0, 1, 2, 3, 5]


def test_first_per_page_matches_the_loop() -> None:
    rng = random.Random(2)
    for _ in range(CASES):
        sizes = _sizes(rng)
        page_of = _page_of(sizes)
        counts = torch.tensor([rng.randint(0, s + 2) for s in sizes.tolist()])
        expected = _first_per_page_loop(page_of, counts)
        got = first_per_page(page_of, counts)
        assert got.dtype == expected.dtype and torch.equal(got, expected), \
            (sizes.tolist(), counts.tolist())


@pytest.mark.parametrize("lengths", [[], [5], [3, 0, 7, 1], [256] * 32])
def test_page_of_visual_matches_the_loop(lengths: list[int]) -> None:
    segments, start = [], 4
    for page, n in enumerate(lengths):
        segments.append(Segment(start, n, page))
        start += n + 2
    n = start + 3
    layout = Layout(token_ids=torch.zeros(n, dtype=torch.long),
                    position_ids=torch.zeros(3, n, dtype=torch.long), segments=segments,
                    question_start=start)
    none: Any = None  # page_of_visual reads the layout alone
    ctx = PolicyContext(layout=layout, budget=0.1, seed=None, scorer=none, cache=none,
                        embeds=none, adapter=none)
    expected = torch.cat([torch.full((s.length,), s.page, dtype=torch.long)
                          for s in segments]) if segments else torch.zeros(0, dtype=torch.long)
    got = ctx.page_of_visual
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_selection_ops_do_not_grow_with_pages() -> None:
    """Equal pages of 256 tokens at 10%: the same aten operations at 2 and 32 pages."""
    totals = []
    for m in (2, 32):
        sizes = torch.full((m,), 256)
        page_of = _page_of(sizes)
        scores = torch.rand(int(page_of.numel()), generator=torch.Generator().manual_seed(m))
        with OpCounter() as counter:
            quotas = quota_split(sizes, round(0.1 * int(sizes.sum())))
            per_page_topk(scores, page_of, quotas)
            first_per_page(page_of, quotas)
        totals.append(counter.total)
    assert totals[0] == totals[1], totals
