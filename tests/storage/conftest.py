"""Fixtures of the storage tests: a real redis-server per session, both metadata stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.metadata import MetadataStore, RedisMetadataStore, SQLiteMetadataStore


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["sqlite", "redis"])
def meta(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
         prefix: str) -> Iterator[MetadataStore]:
    """The same metadata test suite runs against both stores."""
    store: MetadataStore
    if request.param == "sqlite":
        store = SQLiteMetadataStore(tmp_path / "meta.db")
    else:
        store = RedisMetadataStore(redis_url, prefix=prefix)
    yield store
    store.close()
