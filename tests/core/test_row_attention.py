"""The blocked row attention (sdpa fast path) equals one masked attention call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.passes import layer_forward
from conduit_core.passes.row_attention import (
    ROW_CHUNK,
    ROW_SPAN,
    block_bounds,
    block_shape,
    blocked_attention,
    causal_row_mask,
    row_blocks,
)
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


@pytest.mark.parametrize("heads,groups", [(4, 4), (8, 2), (7, 1)])
@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("order", ["sorted", "unsorted", "tail"])
def test_blocked_attention_equals_one_masked_call(heads: int, groups: int, chunk: int,
                                                  order: str) -> None:
    gen = torch.Generator().manual_seed(heads * 100 + chunk)
    n, hd, batch = 97, 16, 2
    if order == "tail":  # the last rows, contiguous (a question): triangular blocks
        rows = torch.arange(n - 23, n)
    else:
        rows = torch.randperm(n, generator=gen)[:40]
        rows = rows.sort().values if order == "sorted" else rows
    q = torch.randn(batch, heads, rows.numel(), hd, generator=gen)
    k = torch.randn(batch, groups, n, hd, generator=gen)
    v = torch.randn(batch, groups, n, hd, generator=gen)
    blocks = row_blocks(rows, n, torch.float32, heads // groups, chunk=chunk)
    assert [b.start for b in blocks] == list(range(0, rows.numel(), chunk))
    for b in blocks:
        assert b.n_keys == int(rows[b.start:b.stop].max()) + 1  # a block reads only its keys
    got = blocked_attention(q, k, v, blocks, scaling=hd ** -0.5)  # (B, R, H, hd)
    want = _reference(q, k, v, rows, hd ** -0.5)
    assert got.shape == (batch, rows.numel(), heads, hd)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_single_row_blocks_need_no_mask_and_masks_are_shared_per_kv_head() -> None:
    rows = torch.tensor([3, 10, 11])
    blocks = row_blocks(rows, 20, torch.float32, rep=2, chunk=1)
    assert all(b.mask is None for b in blocks)
    (blk,) = row_blocks(rows, 20, torch.float32, rep=2, chunk=8)
    assert blk.n_keys == 12 and blk.mask is not None and blk.mask.shape == (1, 1, 6, 12)
    allowed = blk.mask[0, 0] == 0  # (rep * c, n_keys)
    assert torch.equal(allowed[:3], allowed[3:])  # both query heads of the group alike
    assert allowed[0].sum() == 4 and allowed[1].sum() == 11 and allowed[2].sum() == 12


def test_runtime_blocked_and_reference_paths_agree(runtime: ReuseRuntime,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoring pass + CONDUIT refresh through the blocked path equal the one-mask path."""
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"]])
    request = AnswerRequest("Answer from the pages.", [PageInput("Page 1:", kvs[0]),
                                                       PageInput("Page 2:", kvs[1])],
                            "What is the total amount?", policy="conduit", budget=0.3)
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return blocked_attention(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(layer_forward, "blocked_attention", counted)
    fast = probe_refresh(runtime, request)
    assert calls  # the fast path really ran blocked
    monkeypatch.setattr(layer_forward, "BLOCKED_ATTENTION", False)
    seen = len(calls)
    ref = probe_refresh(runtime, request)
    assert len(calls) == seen  # and the reference path did not
    assert torch.equal(fast.visual_rows, ref.visual_rows)
    torch.testing.assert_close(fast.logits, ref.logits, **tol("logits"))


def test_sparse_rows_split_by_span_and_still_match_the_reference() -> None:
    """Refreshed rows spread over a long prompt: a block never spans more than `span`
    positions, so no row reads far past its own keys; the result is unchanged."""
    rows = torch.tensor([5, 40, 300, 301, 560, 900, 1000])
    bounds = block_bounds(rows, 1200, chunk=64, span=256)
    assert bounds == [(0, 2, 41), (2, 4, 302), (4, 5, 561), (5, 7, 1001)]
    assert block_bounds(rows, 1200, chunk=64, span=10_000) == [(0, 7, 1001)]
    gen = torch.Generator().manual_seed(3)
    n, heads, groups, hd = 1200, 4, 2, 8
    q = torch.randn(1, heads, rows.numel(), hd, generator=gen)
    k = torch.randn(1, groups, n, hd, generator=gen)
    v = torch.randn(1, groups, n, hd, generator=gen)
    blocks = row_blocks(rows, n, torch.float32, heads // groups, span=256)
    got = blocked_attention(q, k, v, blocks, scaling=hd ** -0.5)
    torch.testing.assert_close(got, _reference(q, k, v, rows, hd ** -0.5), rtol=1e-5,
                               atol=1e-6)


def _greedy_bounds(host: list[int], n_keys: int, chunk: int, span: int
                   ) -> list[tuple[int, int, int]]:
    """The block rule one row at a time: a block grows while it has fewer than `chunk` rows
    and its rows stay within `span` positions."""
    out, start = [], 0
    while start < len(host):
        stop = start + 1
        while (stop < len(host) and stop - start < chunk
               and max(host[start:stop + 1]) - min(host[start:stop + 1]) <= span):
            stop += 1
        out.append((start, stop, min(max(host[start:stop]) + 1, n_keys)))
        start = stop
    return out


@pytest.mark.parametrize("ascending", [True, False])
def test_block_bounds_follow_the_rule_on_any_rows(ascending: bool) -> None:
    """Ascending rows take one bisection per block; any order gives the rule's blocks."""
    gen = torch.Generator().manual_seed(7)
    for n, count, chunk, span in [(3000, 400, 64, 256), (500, 500, 64, 0), (9000, 50, 8, 1),
                                  (2000, 1, 64, 256), (4000, 1000, 1024, 8192)]:
        rows = torch.randperm(n, generator=gen)[:count]
        rows = rows.sort().values if ascending else rows
        want = _greedy_bounds(rows.tolist(), n, chunk, span)
        assert block_bounds(rows, n, chunk, span) == want


def test_block_shape_is_chosen_per_device() -> None:
    """The CPU keeps 64-row blocks spanning 256 positions (its results unchanged);
    accelerators take few large blocks (one or a few masked calls per layer), and the FLOPs
    accounting charges the keys each device's blocks really read."""
    assert block_shape("cpu") == (ROW_CHUNK, ROW_SPAN) == (64, 256)
    chunk, span = block_shape("cuda")
    assert chunk >= 1024 and span >= 8192
    rows = torch.arange(0, 3000, 3)  # 1,000 rows spread over 3,000 positions
    assert len(block_bounds(rows, 3000, *block_shape("cpu"))) == 16
    assert len(block_bounds(rows, 3000, chunk, span)) == 1
