"""The grouped row attention (sdpa fast path) equals one masked attention call, in a bounded
number of calls whatever the rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.passes import layer_forward
from conduit_core.passes.row_attention import (
    CALL_ROWS,
    CUT_CANDIDATES,
    blocked_attention,
    causal_row_mask,
    group_bounds,
    row_blocks,
    row_groups,
)
from conduit_core.policies import choose_policy
from lab.refresh_probe import probe_refresh
from tests.core.helpers import IMAGES
from tests.device import tol


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
               scaling: float) -> torch.Tensor:
    """Every row over all keys with the full (1, 1, R, N) mask, K/V repeated per head."""
    rep = q.shape[1] // k.shape[1]
    mask = causal_row_mask(rows, k.shape[2], q.dtype)  # (1, 1, R, N)
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scaling).transpose(1, 2)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (7, 1)])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("order", ["sorted", "unsorted", "tail"])
def test_grouped_attention_equals_one_masked_call(heads: int, kv_heads: int, groups: int,
                                                  order: str) -> None:
    gen = torch.Generator().manual_seed(heads * 100 + groups)
    n, hd, batch = 97, 16, 2
    if order == "tail":  # the last rows, contiguous (a question): triangular groups
        rows = torch.arange(n - 23, n)
    else:
        rows = torch.randperm(n, generator=gen)[:40]
        rows = rows.sort().values if order == "sorted" else rows
    q = torch.randn(batch, heads, rows.numel(), hd, generator=gen)
    k = torch.randn(batch, kv_heads, n, hd, generator=gen)
    v = torch.randn(batch, kv_heads, n, hd, generator=gen)
    blocks = row_blocks(rows, n, groups, torch.float32)
    assert len(blocks) <= groups  # a bounded number of calls
    if order == "tail" or groups == 1:  # the tail: no cut saves the keys a call reads
        assert len(blocks) == 1
    elif order == "sorted":  # rows spread over the keys: cuts pay
        assert len(blocks) > 1
    assert [b.start for b in blocks][0] == 0 and blocks[-1].stop == rows.numel()
    assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:], strict=False))
    for b in blocks:  # keys up to the group's last row; one group reads every key (its rows
        # are never read back: on an accelerator they may be the device's choice)
        assert b.n_keys == (n if groups == 1 else int(rows[:b.stop].max()) + 1)
    got = blocked_attention(q, k, v, blocks, scaling=hd ** -0.5)  # (B, R, H, hd)
    want = _reference(q, k, v, rows, hd ** -0.5)
    assert got.shape == (batch, rows.numel(), heads, hd)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_groups_that_see_every_key_need_no_mask() -> None:
    rows = torch.tensor([3, 10, 11])
    (blk,) = row_blocks(rows, 20, 1, torch.float32)  # one group: every key, under its mask
    assert blk.n_keys == 20 and blk.mask is not None and blk.mask.shape == (3, 20)
    allowed = blk.mask == 0  # (c, n_keys)
    assert allowed[0].sum() == 4 and allowed[1].sum() == 11 and allowed[2].sum() == 12
    single = row_blocks(torch.tensor([3, 40]), 41, 2, torch.float32)  # a row a group
    assert [b.mask for b in single] == [None, None] and [b.n_keys for b in single] == [4, 41]


def test_runtime_blocked_and_reference_paths_agree(runtime: ReuseRuntime,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoring pass + CONDUIT refresh through the grouped path equal the one-mask path."""
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"]])
    request = AnswerRequest("Answer from the pages.", [PageInput("Page 1:", kvs[0]),
                                                       PageInput("Page 2:", kvs[1])],
                            "What is the total amount?",
                            policy=choose_policy("conduit"), budget=0.3)
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return blocked_attention(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(layer_forward, "blocked_attention", counted)
    fast = probe_refresh(runtime, request)
    assert calls  # the fast path really ran grouped
    monkeypatch.setattr(layer_forward, "BLOCKED_ATTENTION", False)
    seen = len(calls)
    ref = probe_refresh(runtime, request)
    assert len(calls) == seen  # and the reference path did not
    assert torch.equal(fast.visual_rows, ref.visual_rows)
    torch.testing.assert_close(fast.logits, ref.logits, **tol("logits"))


def test_cuts_cost_the_least() -> None:
    """The cut points are the ones that cost the least in all (the keys the rows read, and
    each call's own read of its keys), among the candidates: against every choice of at
    most three runs, brute force."""
    gen = torch.Generator().manual_seed(5)
    rows = torch.randperm(3000, generator=gen)[:30].sort().values  # 30 rows: every place
    assert CUT_CANDIDATES >= 30  # is a candidate
    got = group_bounds(rows, 3000, 3)

    def cost(cuts: tuple[int, ...]) -> float:
        edges = (0, *cuts, 30)
        return sum((b - a + CALL_ROWS) * (int(rows[b - 1]) + 1)
                   for a, b in zip(edges, edges[1:], strict=False))

    choices = [(), *((a,) for a in range(1, 30)),
               *((a, b) for a in range(1, 29) for b in range(a + 1, 30))]
    best = min(cost(c) for c in choices)
    assert cost(tuple(start for start, _, _ in got[1:])) == pytest.approx(best)
    assert len(got) == 3  # spread rows: every cut pays


def test_a_run_of_rows_at_the_end_takes_one_call() -> None:
    """A follow-up's rows (a run at the end of a long conversation) read every key in
    whatever group: on the CPU they take one call, not four."""
    rows = torch.arange(1833, 1862)  # (29,)
    assert group_bounds(rows, 1862, row_groups("cpu")) == [(0, 29, 1862)]


def test_groups_are_chosen_per_device_and_bounded_whatever_the_rows() -> None:
    """The CPU takes at most four calls a layer (four where the rows spread), accelerators
    one, for 10 rows or 10,000 (issue 58: no launch count that grows with the pages)."""
    assert row_groups("cpu") == 4 and row_groups("cuda") == 1
    for count in (10, 1000, 10_000):
        rows = torch.arange(0, 3 * count, 3)
        assert len(group_bounds(rows, 3 * count, row_groups("cpu"))) == (3 if count == 10
                                                                          else 4)
        assert len(group_bounds(rows, 3 * count, row_groups("cuda"))) == 1
