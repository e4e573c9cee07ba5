"""Static shapes for the compiled passes: a pass's rows and keys padded to a bucket, with the
padding made inert.

A forward of R rows over n keys runs at (R_b, K_b): R_b the smallest power of two >= R (at
least `MIN_ROWS`), K_b the smallest power of two > n (at least `MIN_KEYS`), so that every
padded row has a key position of its own to write. Powers of two bound the graphs compiled
to about log2 of the largest shape per axis (a few tens in all at 32 pages of 256 tokens)
and the padding to less than the shape itself; finer steps (1.5x) halve the padding and
double the graphs, each a compilation at startup (docs/DECISIONS.md).

Inertness: padded rows are zero hidden states at position 0 that write their K/V to the
scratch position K_b - 1, which no real row sees (real rows are < n <= K_b - 1), and attend
to the keys up to it (a finite softmax); their outputs are dropped. Keys from n to K_b - 1
are masked for every real row and hold finite values (a masked key's weight is then an exact
0): the first compiled forward over a cache lent anew zeroes them at every layer
(`clear_tail`), and every later write there is a K/V the model computed. The cache positions
from n on therefore hold nothing a forward's caller needs (assembly and decode write them
before reading them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from conduit_core.kv.kv_cache import KVCache
from conduit_core.passes.row_attention import additive_mask

MIN_ROWS = 16
MIN_KEYS = 64


def row_bucket(n_rows: int) -> int:
    """The rows a forward of `n_rows` rows runs at: a power of two, at least `MIN_ROWS`."""
    return max(MIN_ROWS, 1 << max(n_rows - 1, 0).bit_length())


def key_bucket(n_keys: int) -> int:
    """The keys a forward over `n_keys` keys reads: a power of two > n_keys (room for the
    scratch position), at least `MIN_KEYS`."""
    return max(MIN_KEYS, 1 << n_keys.bit_length())


@dataclass(frozen=True)
class PaddedRows:
    """One forward's rows at their bucket: what each compiled layer body reads."""

    n_rows: int  # R, the real rows (the first R of every padded tensor)
    n_keys: int  # n, the real keys
    writes: torch.Tensor  # (R_b,) cache positions written: the rows, then the scratch slot
    mask: torch.Tensor  # (1, 1, R_b, K_b) additive: causal, padding up to the scratch slot
    cos: torch.Tensor  # (B, R_b, hd)
    sin: torch.Tensor  # (B, R_b, hd)

    @property
    def keys(self) -> int:
        """K_b."""
        return int(self.mask.shape[-1])

    def pad(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` (B, R, d) with zero rows appended: (B, R_b, d)."""
        return F.pad(hidden, (0, 0, 0, self.writes.numel() - self.n_rows))  # (B, R_b, d)


def pad_rows(rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_keys: int,
             dtype: torch.dtype) -> PaddedRows:
    """Rows (R,) with their rotary cos/sin (B, R, hd), over `n_keys` keys, at their bucket,
    in five operations. Shapes only come from R and n_keys: nothing is read back from the
    device."""
    r = int(rows.numel())
    r_b, k_b = row_bucket(r), key_bucket(n_keys)
    writes = F.pad(rows, (0, r_b - r), value=k_b - 1)  # (R_b,)
    mask = additive_mask(writes, k_b, dtype, rows.device)  # (R_b, K_b)
    pcos = F.pad(cos, (0, 0, 0, r_b - r), value=1.0)  # (B, R_b, hd) padding at position 0:
    psin = F.pad(sin, (0, 0, 0, r_b - r))  # cos 1, sin 0
    return PaddedRows(r, n_keys, writes, mask.view(1, 1, r_b, k_b), pcos, psin)


def fits(cache: KVCache, n_keys: int) -> bool:
    """Whether `cache` holds the key bucket of `n_keys` (a forward over it can be padded)."""
    return cache.capacity >= key_bucket(n_keys)


def clear_tail(cache: KVCache, n_keys: int) -> None:
    """Zero the keys and values of positions [n_keys, K_b) of every layer, unless done
    already for `n_keys` since the cache was lent (`lent`; see the module docstring)."""
    if cache.cleared_tail == n_keys:
        return
    k_b = key_bucket(n_keys)
    cache.keys[:, :, :, n_keys:k_b].zero_()
    cache.values[:, :, :, n_keys:k_b].zero_()
    cache.cleared_tail = n_keys


def lent(cache: KVCache) -> None:
    """`cache` is lent anew (its last user's writes are not trusted): the next compiled
    forward over it clears its tail again."""
    cache.cleared_tail = None
