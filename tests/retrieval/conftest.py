"""One shared embedder for the retrieval tests (the model loads once per session)."""

from __future__ import annotations

import pytest

from worker.retrieval import Embedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """all-MiniLM-L6-v2 from the pip package, offline."""
    return Embedder()
