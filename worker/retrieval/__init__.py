"""Page retrieval: BM25 (bm25s) and dense all-MiniLM-L6-v2 rankings fused by RRF.

Ingest: `embed_pages(texts, embedder)` -> per page a `(1, 384)` float32 matrix (the mean of
its 120-word passages; `PassageConfig(mode="max")` keeps one row per passage instead), stored
as `embedding_to_bytes(...)`. Answer: build `Candidate`s for the pages in scope (the caller
applies the scope: the whole collection or the pages of chosen document ids) and call
`search(query, candidates, top_k=..., embedder=...)`.
"""

from worker.retrieval.embedder import (
    EMBEDDING_DIM,
    Embedder,
    embedding_from_bytes,
    embedding_to_bytes,
)
from worker.retrieval.fusion import Ranking, reciprocal_rank_fusion
from worker.retrieval.hybrid import Candidate, Hit, search
from worker.retrieval.passages import PassageConfig, embed_pages, split_passages

__all__ = [
    "EMBEDDING_DIM",
    "Candidate",
    "Embedder",
    "Hit",
    "PassageConfig",
    "Ranking",
    "embed_pages",
    "embedding_from_bytes",
    "embedding_to_bytes",
    "reciprocal_rank_fusion",
    "search",
    "split_passages",
]
