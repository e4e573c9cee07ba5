"""Suite-wide settings (no model hub, deterministic CPU threads) and the shared real
redis-server."""

import os
from collections.abc import Iterator

import pytest

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from lab.processes import start_redis

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The service's default model is builtin:small-qwen2-vl (pages of ~300 visual tokens, 26M
# parameters); the suite runs its services on the tiny test model to stay fast, and tests the
# default model itself where it matters (tests/core/test_default_model.py).
os.environ.setdefault("CONDUIT_MODEL", "builtin:tiny-qwen2-vl")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a redis-server shared by the session (tests use unique keys, prefixes and
    channels)."""
    url, stop = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    stop()
