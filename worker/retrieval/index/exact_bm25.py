"""Exact BM25 for the index's candidates: the scan path's scores, not Tantivy's.

Tantivy ranks with its own BM25: k1 1.2 and page lengths rounded to one byte (its field
norms), neither configurable from Python. The scan path (`bm25.bm25_scores`, bm25s) uses
k1 1.5 and exact lengths, so close pages would come out in a different order. Here Tantivy
only chooses the candidates (its top `depth` pages); each is then scored exactly as bm25s
scores it:

    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))        N, df over the live scope
    tfc(t,p) = tf / (k1 (1 - b + b len(p) / avglen) + tf)     exact len(p), avglen over scope
    score(p) = sum over the question's stems, in order and with repeats, of
               float32(float32(idf) * tfc), added in float32    (bm25s's rounding)

Each page's distinct stems are stored with the page (`terms.u64`): one uint64 per stem, a
48-bit hash of the stem above its 16-bit count on the page, sorted. Document frequencies are
Tantivy's (`reader.document_frequencies`).
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np

K1 = 1.5  # bm25s's defaults, as `bm25.bm25_scores` uses them
B = 0.75
COUNT_BITS = 16  # a stem's count on a page, below its hash (pages hold at most a few thousand)


@functools.lru_cache(maxsize=262_144)
def _key(stem: str) -> int:
    digest = hashlib.blake2b(stem.encode(), digest_size=6).digest()
    return int.from_bytes(digest, "little")


def stem_keys(stems: list[str]) -> np.ndarray:
    """The 48-bit keys of `stems` (uint64, in order; two of a few hundred thousand distinct
    stems share one with a chance of about 1e-4, and then only if they meet on one page)."""
    return np.fromiter((_key(s) for s in stems), dtype=np.uint64, count=len(stems))


def page_entries(stems: list[str]) -> np.ndarray:
    """A page's stored stems: one `key << 16 | count` per distinct stem, sorted (uint64)."""
    keys, counts = np.unique(stem_keys(stems), return_counts=True)
    counts = np.minimum(counts, (1 << COUNT_BITS) - 1).astype(np.uint64)
    return (keys << np.uint64(COUNT_BITS)) | counts


def exact_scores(query_stems: list[str], df: list[int], n_pages: int, mean_length: float,
                 starts: np.ndarray, distinct: np.ndarray, lengths: np.ndarray,
                 entries: np.ndarray) -> np.ndarray:
    """bm25s's score of each candidate page (float32).

    `query_stems` are the question's stems (repeats count twice, as in bm25s), `df` their
    document frequencies in the same order, `n_pages` and `mean_length` the scope's page
    count and mean length in stems; candidate i has `lengths[i]` stems and its `distinct[i]`
    entries (`page_entries`) at `entries[starts[i]:starts[i] + distinct[i]]`."""
    scores = np.zeros(len(starts), dtype=np.float32)
    if not query_stems or not len(starts) or n_pages == 0:
        return scores
    wanted, column = np.unique(stem_keys(query_stems), return_inverse=True)  # (u,), (q,)
    ends = np.cumsum(distinct)  # (c,)
    rows = np.arange(int(ends[-1]), dtype=np.int64)  # (total,)
    rows += np.repeat(starts - (ends - distinct), distinct)
    stored = entries[rows]  # (total,) uint64
    keys = stored >> np.uint64(COUNT_BITS)
    hit = np.flatnonzero(np.isin(keys, wanted))  # (hits,)
    tf = np.zeros((len(starts), len(wanted)), dtype=np.float64)  # (c, u)
    tf[np.searchsorted(ends, hit, side="right"), np.searchsorted(wanted, keys[hit])] = \
        stored[hit] & np.uint64((1 << COUNT_BITS) - 1)
    norm = K1 * ((1 - B) + B * lengths / mean_length)  # (c,) float64, as bm25s
    for j, q in enumerate(column):
        if df[j] == 0:  # a stem no page of the scope holds: bm25s skips it
            continue
        idf = np.float32(math.log(1 + (n_pages - df[j] + 0.5) / (df[j] + 0.5)))
        f = tf[:, q].astype(np.float32)
        scores += (idf * (f / (norm + f))).astype(np.float32)
    return scores
