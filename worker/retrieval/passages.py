"""Split page text into passages and embed pages at ingest time.

all-MiniLM-L6-v2 reads at most 256 word pieces; a dense page holds several times that, so a
page is cut into overlapping word windows and every window is embedded. `PassageMode` says
what is stored per page: their renormalised mean ("mean", the default: one 384-float vector,
1,536 bytes), every passage vector ("max": the page scores as its best passage; the blob
holds one row per passage), or only the first window ("first"). On the dev set
(`lab/retrieval/NOTES.md`) mean and max tie within noise and both beat truncating the
page to the model's 256 word pieces; mean is the default because it keeps one vector per page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from worker.retrieval.document_context import with_context
from worker.retrieval.embedder import EMBEDDING_DIM, Embedder

PassageMode = Literal["max", "mean", "first"]

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class PassageConfig:
    """Word-window size, overlap and cap on passages per page, and the storage mode."""

    words: int = 120
    overlap: int = 30
    max_passages: int = 12
    mode: PassageMode = "mean"


DEFAULT_PASSAGES = PassageConfig()


def split_passages(text: str, config: PassageConfig = DEFAULT_PASSAGES) -> list[str]:
    """Overlapping windows of `config.words` words (at most `config.max_passages`).

    Empty or whitespace-only text gives no passages.
    """
    words = _WORD.findall(text)
    if not words:
        return []
    step = max(config.words - config.overlap, 1)
    passages = []
    for start in range(0, len(words), step):
        passages.append(" ".join(words[start:start + config.words]))
        if start + config.words >= len(words) or len(passages) >= config.max_passages:
            break
    return passages


def embed_pages(
    texts: list[str], embedder: Embedder, config: PassageConfig = DEFAULT_PASSAGES,
    contexts: list[str] | None = None,
) -> list[np.ndarray | None]:
    """Embed each page text as an `(n, 384)` float32 matrix (None for a page without text).

    `contexts` (one per page, e.g. its document's title words from
    `document_context`) is written in front of every passage of its page.
    All passages of all pages go through the model in one batch.
    """
    if contexts is not None and len(contexts) != len(texts):
        raise ValueError("one context per page text")
    passages: list[str] = []
    owners: list[int] = []
    for index, text in enumerate(texts):
        chunks = split_passages(text, config)
        if config.mode == "first":
            chunks = chunks[:1]
        if contexts is not None:
            chunks = [with_context(contexts[index], chunk) for chunk in chunks]
        passages.extend(chunks)
        owners.extend([index] * len(chunks))
    vectors = embedder.embed(passages)
    out: list[np.ndarray | None] = [None] * len(texts)
    owner_array = np.asarray(owners, dtype=np.int64)
    for index in range(len(texts)):
        rows = vectors[owner_array == index] if len(owners) else vectors[:0]
        if len(rows) == 0:
            continue
        if config.mode == "mean":
            mean = rows.mean(axis=0)
            rows = (mean / max(float(np.linalg.norm(mean)), 1e-12))[None, :]
        out[index] = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, EMBEDDING_DIM)
    return out
