"""The compiled passes' padding (`conduit_core.passes.buckets`): the tail of a cache's key
bucket, which every real row masks, is zeroed once per lease at every layer, not once per
forward; a cache lent anew by the runtime's workspace (`ReuseSteps.take_cache`) is cleared
again, whatever its last user left there; padded rows attend to finite keys only."""

from __future__ import annotations

import torch

from conduit_core.passes.buckets import clear_tail, key_bucket, pad_rows
from conduit_core.runtime import ReuseRuntime
from lab.ttft.op_count import count_ops, narrow_vlm

N_KEYS = 37  # a bucket of 64 keys: positions 37..63 are the tail


def _tail(cache: torch.Tensor) -> torch.Tensor:
    return cache[:, :, :, N_KEYS:key_bucket(N_KEYS)]


def test_a_lent_cache_is_cleared_once_then_again_when_lent_anew() -> None:
    rt = ReuseRuntime(narrow_vlm(layers=3))
    cache = rt.reuse.take_cache(N_KEYS, 0)
    cache.keys.fill_(float("nan"))  # what a fresh or reused cache may hold
    cache.values.fill_(float("nan"))
    _, first = count_ops(lambda: clear_tail(cache, N_KEYS))
    assert first.total == 2  # every layer at once, keys and values
    assert not _tail(cache.keys).any() and not _tail(cache.values).any()
    _tail(cache.keys).fill_(1.0)  # a forward's scratch writes: finite, kept
    _, again = count_ops(lambda: clear_tail(cache, N_KEYS))
    assert again.total == 0 and bool((_tail(cache.keys) == 1.0).all())
    assert rt.reuse.workspace.give(cache)
    _tail(cache.keys).fill_(float("nan"))  # its last user's leftovers
    taken = rt.reuse.take_cache(N_KEYS, 0)
    assert taken is cache  # the workspace lends the same storage again
    clear_tail(taken, N_KEYS)
    assert not _tail(taken.keys).isnan().any()


def test_padded_rows_see_finite_keys_and_real_rows_their_causal_keys() -> None:
    rows = torch.tensor([3, 9, 36])
    cos, sin = torch.rand(1, 3, 8), torch.rand(1, 3, 8)
    padded = pad_rows(rows, cos, sin, N_KEYS, torch.float32)
    k_b = key_bucket(N_KEYS)
    assert padded.writes.tolist() == [3, 9, 36, *[k_b - 1] * 13]
    seen = padded.mask[0, 0] == 0  # (R_b, K_b)
    for i, row in enumerate(rows.tolist()):
        assert seen[i].nonzero().view(-1).tolist() == list(range(row + 1))
    assert bool(seen[3:].all())  # padding: every key up to the scratch slot, all finite
    assert torch.equal(padded.cos[:, :3], cos) and bool((padded.cos[:, 3:] == 1).all())
    assert torch.equal(padded.sin[:, :3], sin) and not padded.sin[:, 3:].any()
