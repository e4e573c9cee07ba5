"""Approximate dense search for large collections: an inverted file (IVF) over passage vectors.

Below `MIN_ROWS` passage vectors a collection is scored exactly (every row, as the scan path).
From there on the rows are clustered by spherical k-means into `list_count(rows)` lists; each
new row's nearest list is appended to the version's lists file as the row is added, and a
question scores exactly only the rows of the lists whose centroids are nearest to the query
(about `SCAN_ROWS` rows), so a warm question's dense cost stays nearly flat as the collection
grows. The centroids are retrained (and every row reassigned) once the collection has grown
`RETRAIN_GROWTH` times past the size they were trained at, so lists stay about as long.
"""

from __future__ import annotations

import math

import numpy as np

MIN_ROWS = 32_768  # fewer passage vectors than this: exact scoring, no lists
SCAN_ROWS = 4_096  # about this many rows are scored exactly per question
RETRAIN_GROWTH = 4  # retrain when the rows reach this multiple of the trained size
SAMPLE_PER_LIST = 16  # k-means training points per list
SEED_PER_LIST = 8  # k-means++ seeding points per list (a subset of the training sample)
ITERATIONS = 8  # k-means rounds
ASSIGN_BATCH = 8192  # rows per assignment matmul


def list_count(rows: int) -> int:
    """Number of lists for a collection of `rows` vectors: 4 sqrt(rows), in [16, 4096]. Finer
    lists find more of the exact top 10 at the same share of rows scored (the choice:
    docs/DECISIONS.md, "Large collections score the vectors nearest the question")."""
    return int(min(max(round(4 * math.sqrt(rows)), 16), 4096))


def due(rows: int, trained_rows: int, min_rows: int = MIN_ROWS) -> bool:
    """Whether the lists should be (re)trained: first past `min_rows`, then on each
    `RETRAIN_GROWTH`-fold growth."""
    if rows < min_rows:
        return False
    return trained_rows == 0 or rows >= RETRAIN_GROWTH * trained_rows


def train(vectors: np.ndarray, lists: int, *, seed: int = 0) -> np.ndarray:
    """Spherical k-means centroids `(lists, d)` (unit rows) of unit vectors `(n, d)`, trained
    on a random sample of `SAMPLE_PER_LIST` points per list from a k-means++ start (seeded on
    `SEED_PER_LIST` of them per list); an empty list is reseeded from a random sample point."""
    rng = np.random.default_rng(seed)
    n = len(vectors)
    lists = min(lists, n)
    take = rng.choice(n, size=min(n, lists * SAMPLE_PER_LIST), replace=False)
    sample = np.asarray(vectors[np.sort(take)], dtype=np.float32)[rng.permutation(len(take))]
    centroids = _kmeans_plus_plus(sample[:lists * SEED_PER_LIST], lists, rng)  # (L, d)
    for _ in range(ITERATIONS):
        nearest = assign(sample, centroids)  # (S,)
        sums = np.zeros_like(centroids)
        np.add.at(sums, nearest, sample)
        empty = np.bincount(nearest, minlength=lists) == 0
        sums[empty] = sample[rng.choice(len(sample), size=int(empty.sum()))]
        centroids = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    return centroids.astype(np.float32)


def _kmeans_plus_plus(sample: np.ndarray, lists: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding: each next centroid is a sample point drawn with probability
    proportional to its squared distance from the nearest centroid so far."""
    chosen = [int(rng.integers(len(sample)))]
    nearest = np.full(len(sample), np.inf, dtype=np.float32)  # (S,) squared distances
    for _ in range(1, lists):
        # |a - b|^2 = 2 - 2 a.b for unit vectors
        np.minimum(nearest, np.maximum(2 - 2 * (sample @ sample[chosen[-1]]), 0), out=nearest)
        total = float(nearest.sum())
        chosen.append(int(rng.choice(len(sample), p=nearest / total)) if total > 0
                      else int(rng.integers(len(sample))))
    return sample[chosen].copy()


def assign(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each row's nearest centroid (largest dot product), as int32 `(n,)`."""
    out = np.empty(len(vectors), dtype=np.int32)
    for start in range(0, len(vectors), ASSIGN_BATCH):
        block = np.asarray(vectors[start:start + ASSIGN_BATCH], dtype=np.float32)  # (B, d)
        out[start:start + len(block)] = (block @ centroids.T).argmax(axis=1)
    return out


def probe(centroids: np.ndarray, query: np.ndarray, rows: int, scan_rows: int = SCAN_ROWS
          ) -> np.ndarray:
    """The lists whose rows a question with unit vector `query` scores: those of the nearest
    centroids, as many as hold about `scan_rows` of the `rows` rows on average."""
    lists = len(centroids)
    count = min(lists, max(1, math.ceil(scan_rows * lists / max(rows, 1))))
    closeness = centroids @ query  # (L,)
    return np.argpartition(-closeness, count - 1)[:count]
