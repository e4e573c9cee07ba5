"""BM25 ranking of candidate texts with bm25s (English stop words, Snowball stemming)."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import threading
from collections import OrderedDict

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import STOPWORDS_EN

# bm25s sets its logger to DEBUG, which prints a line per index build whatever the
# application's level; follow the root logger instead.
logging.getLogger("bm25s").setLevel(logging.NOTSET)


@functools.cache
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


_WORDS = re.compile(r"(?u)\b\w\w+\b").findall  # bm25s's default token pattern
_STOPWORDS = frozenset(STOPWORDS_EN)
_STEM_CACHE_SIZE = 500_000  # word -> stem; cleared when full (a few tens of MB at most)
_stems: dict[str, str] = {}


def tokenize(texts: list[str]) -> list[list[str]]:
    """Texts as BM25 sees them: exactly `bm25s.tokenize(texts, stopwords="en",
    stemmer=<Snowball English>, return_ids=False)` (lower case, bm25s's word pattern and
    English stop words, Snowball stems; tested equal), without bm25s's per-call overhead.
    Shared by the persistent index's writer and its queries."""
    words = [[w for w in _WORDS(text.lower()) if w not in _STOPWORDS] for text in texts]
    stems = _stems
    new = list({w: None for ws in words for w in ws if w not in stems})
    if new:
        if len(stems) + len(new) > _STEM_CACHE_SIZE:
            stems.clear()
            new = list({w: None for ws in words for w in ws})
        stems.update(zip(new, _stemmer().stemWords(new), strict=True))
    return [[stems[w] for w in ws] for ws in words]


_INDEX_CACHE_SIZE = 8
_indexes: OrderedDict[str, tuple[bm25s.BM25, dict[str, int]]] = OrderedDict()
_indexes_lock = threading.Lock()


def _corpus_key(texts: list[str], k1: float, b: float) -> str:
    h = hashlib.sha256(f"{k1}:{b}:{len(texts)}".encode())
    for text in texts:
        h.update(len(text).to_bytes(8, "little"))
        h.update(text.encode())
    return h.hexdigest()


def _index(texts: list[str], k1: float, b: float) -> tuple[bm25s.BM25, dict[str, int]]:
    """The BM25 index of `texts` and its vocabulary, built once per distinct candidate set
    (an LRU of the last few sets: repeated questions over one collection reuse it)."""
    key = _corpus_key(texts, k1, b)
    with _indexes_lock:
        if key in _indexes:
            _indexes.move_to_end(key)
            return _indexes[key]
    corpus = bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(), show_progress=False)
    index = bm25s.BM25(k1=k1, b=b)
    if corpus.vocab:
        index.index(corpus, show_progress=False)
    with _indexes_lock:
        _indexes[key] = (index, dict(corpus.vocab))
        while len(_indexes) > _INDEX_CACHE_SIZE:
            _indexes.popitem(last=False)
    return index, dict(corpus.vocab)


def bm25_scores(query: str, texts: list[str], *, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """BM25 score of every text for `query` (float32, 0 where no query term occurs).

    Stateless over whatever candidates the caller selected; the index of a candidate set is
    cached (keyed by a digest of the texts), so only the first question over a set pays for
    tokenising and indexing.
    """
    scores = np.zeros(len(texts), dtype=np.float32)
    if not texts:
        return scores
    query_tokens = bm25s.tokenize(
        [query], stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False
    )[0]
    if not query_tokens:
        return scores
    index, vocab = _index(texts, k1, b)
    if not vocab:
        return scores
    known = [token for token in query_tokens if token in vocab]
    if not known:
        return scores
    return np.asarray(index.get_scores(known), dtype=np.float32)
