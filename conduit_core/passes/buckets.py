"""Static shapes for the compiled passes: a pass's rows and keys padded to a bucket, with the
padding made inert.

A forward of R rows over n keys runs at (R_b, K_b): R_b the smallest power of two >= R (at
least `MIN_ROWS`), K_b the smallest power of two > n (at least `MIN_KEYS`), so that every
padded row has a key position of its own to write. Powers of two bound the graphs compiled
to about log2 of the largest shape per axis (a few tens in all at 32 pages of 256 tokens)
and the padding to less than the shape itself; finer steps (1.5x) halve the padding and
double the graphs, each a compilation at startup (docs/DECISIONS.md).

Inertness: padded rows are zero hidden states at position 0 that attend to key 0 alone (a
finite softmax) and write their K/V to the scratch position K_b - 1, which no real row sees
(real rows are < n <= K_b - 1); their outputs are dropped. Keys from n to K_b - 1 are masked
for every real row and zeroed before the forward (`clear_tail`), so that whatever the cache
held there stays out of the softmax. The cache positions from n on therefore hold nothing a
forward's caller needs (assembly and decode write them before reading them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.kv.kv_cache import KVCache

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
    mask: torch.Tensor  # (1, 1, R_b, K_b) additive: causal for real rows, key 0 for padding
    cos: torch.Tensor  # (B, R_b, hd)
    sin: torch.Tensor  # (B, R_b, hd)

    @property
    def keys(self) -> int:
        """K_b."""
        return int(self.mask.shape[-1])

    def pad(self, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` (B, R, d) with zero rows appended: (B, R_b, d)."""
        b, _, d = hidden.shape
        out = hidden.new_zeros(b, self.writes.numel(), d)  # (B, R_b, d)
        out[:, :self.n_rows] = hidden
        return out


def pad_rows(rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_keys: int,
             dtype: torch.dtype) -> PaddedRows:
    """Rows (R,) with their rotary cos/sin (B, R, hd), over `n_keys` keys, at their bucket.
    Shapes only come from R and n_keys: nothing is read back from the device."""
    r = int(rows.numel())
    r_b, k_b = row_bucket(r), key_bucket(n_keys)
    device = rows.device
    writes = torch.full((r_b,), k_b - 1, dtype=torch.long, device=device)  # (R_b,)
    writes[:r] = rows
    seen = torch.zeros(r_b, dtype=torch.long, device=device)  # (R_b,) last key each row sees
    seen[:r] = rows
    keys = torch.arange(k_b, device=device)  # (K_b,)
    allowed = keys.view(1, -1) <= seen.view(-1, 1)  # (R_b, K_b)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    b, _, hd = cos.shape
    pcos = cos.new_ones(b, r_b, hd)  # (B, R_b, hd) padding at position 0: cos 1, sin 0
    psin = sin.new_zeros(b, r_b, hd)
    pcos[:, :r], psin[:, :r] = cos, sin
    return PaddedRows(r, n_keys, writes, mask.view(1, 1, r_b, k_b), pcos, psin)


def fits(cache: KVCache, n_keys: int) -> bool:
    """Whether `cache` holds the key bucket of `n_keys` (a forward over it can be padded)."""
    return cache.capacity >= key_bucket(n_keys)


def clear_tail(cache: KVCache, layers: range, n_keys: int) -> None:
    """Zero the keys and values of positions [n_keys, K_b) of `layers` (see module docstring)."""
    if not len(layers):
        return
    k_b = key_bucket(n_keys)
    span = slice(layers.start, layers.stop, layers.step)
    cache.keys[span, :, :, n_keys:k_b].zero_()
    cache.values[span, :, :, n_keys:k_b].zero_()
