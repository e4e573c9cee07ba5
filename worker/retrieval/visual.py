"""The optional visual retriever slot: page images scored against the query directly.

`VisualRetriever` is the protocol; `ColRetriever` implements it with a ColPali-family model
from transformers (ColPali, ColQwen2, ColModernVBert) loaded from a local folder, and
`load_visual_retriever(path)` is the config hook (None when no path is configured).

No visual retriever ships by default: the project has no offline ColPali weights, so the
default search fuses BM25 and dense text rankings only. With a model path configured, the
ingest pipeline stores `embed_pages` output per page and passes it as `Candidate.visual`;
`hybrid.search` then fuses a third, late-interaction ranking.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from PIL import Image


@runtime_checkable
class VisualRetriever(Protocol):
    """Multi-vector embeddings of page images and of queries in one space."""

    def embed_pages(self, images: Sequence[Image.Image]) -> list[np.ndarray]:
        """One `(tokens, d)` float32 matrix per page image."""
        ...

    def embed_query(self, query: str) -> np.ndarray:
        """A `(query_tokens, d)` float32 matrix."""
        ...


def late_interaction_scores(query: np.ndarray, pages: Sequence[np.ndarray | None]) -> np.ndarray:
    """ColBERT MaxSim: per page, the sum over query vectors of their best dot product.

    Pages given as None score -inf.
    """
    q = np.asarray(query, dtype=np.float32)
    scores = np.full(len(pages), -np.inf, dtype=np.float32)
    for i, page in enumerate(pages):
        if page is None or not np.size(page):
            continue
        sims = q @ np.asarray(page, dtype=np.float32).T
        scores[i] = float(sims.max(axis=1).sum())
    return scores


_FAMILIES = {
    "colpali": ("ColPaliForRetrieval", "ColPaliProcessor"),
    "colqwen2": ("ColQwen2ForRetrieval", "ColQwen2Processor"),
    "colmodernvbert": ("ColModernVBertForRetrieval", "ColModernVBertProcessor"),
}


class ColRetriever:
    """A ColPali-family retriever loaded from a local transformers checkpoint folder."""

    def __init__(self, model_path: str | Path, *, device: str = "cpu",
                 dtype: str = "float32", batch_size: int = 4) -> None:
        import torch
        import transformers

        config = transformers.AutoConfig.from_pretrained(str(model_path), local_files_only=True)
        family = _FAMILIES.get(config.model_type)
        if family is None:
            raise ValueError(
                f"{model_path}: model type {config.model_type!r} is not a supported visual "
                f"retriever (one of {sorted(_FAMILIES)})"
            )
        model_cls = getattr(transformers, family[0])
        processor_cls = getattr(transformers, family[1])
        self.processor: Any = processor_cls.from_pretrained(str(model_path),
                                                            local_files_only=True)
        self.model: Any = model_cls.from_pretrained(
            str(model_path), dtype=getattr(torch, dtype), local_files_only=True
        ).to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def _run(self, batch: Any) -> list[np.ndarray]:
        import torch

        batch = batch.to(self.device)
        with self._lock, torch.inference_mode():
            embeddings = self.model(**batch).embeddings
        mask = batch["attention_mask"].bool()
        return [e[m].float().cpu().numpy() for e, m in zip(embeddings, mask, strict=True)]

    def embed_pages(self, images: Sequence[Image.Image]) -> list[np.ndarray]:
        """Multi-vector embedding of each page image (padding tokens dropped)."""
        out: list[np.ndarray] = []
        for start in range(0, len(images), self.batch_size):
            chunk = [im.convert("RGB") for im in images[start:start + self.batch_size]]
            out.extend(self._run(self.processor.process_images(images=chunk,
                                                               return_tensors="pt")))
        return out

    def embed_query(self, query: str) -> np.ndarray:
        """Multi-vector embedding of the query text."""
        return self._run(self.processor.process_queries(text=[query], return_tensors="pt"))[0]


def load_visual_retriever(model_path: str | Path | None, *, device: str = "cpu",
                          dtype: str = "float32") -> VisualRetriever | None:
    """The config hook: a `ColRetriever` for `model_path`, or None when none is configured."""
    if model_path is None or str(model_path) == "":
        return None
    return ColRetriever(model_path, device=device, dtype=dtype)
