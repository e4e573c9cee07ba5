"""BM25 ranking of candidate texts with bm25s (English stop words, Snowball stemming)."""

from __future__ import annotations

import functools

import bm25s
import numpy as np
import Stemmer


@functools.cache
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def bm25_scores(query: str, texts: list[str], *, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """BM25 score of every text for `query` (float32, 0 where no query term occurs).

    The index is built over `texts` on each call: retrieval is stateless over whatever
    candidates the caller selected (tokenising and indexing 10,000 pages takes about a second
    on one core).
    """
    scores = np.zeros(len(texts), dtype=np.float32)
    if not texts:
        return scores
    query_tokens = bm25s.tokenize(
        [query], stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False
    )[0]
    if not query_tokens:
        return scores
    corpus = bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(), show_progress=False)
    if not corpus.vocab:
        return scores
    index = bm25s.BM25(k1=k1, b=b)
    index.index(corpus, show_progress=False)
    known = [token for token in query_tokens if token in corpus.vocab]
    if not known:
        return scores
    return np.asarray(index.get_scores(known), dtype=np.float32)
