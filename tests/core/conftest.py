"""Shared fixtures for conduit_core tests: builtin tiny models materialised once per session,
loaded on `CONDUIT_TEST_DEVICE` in `CONDUIT_TEST_DTYPE` (default cpu, float32; `tests.device`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.model.loader import LoadedVLM, load_vlm
from conduit_core.runtime import ReuseRuntime
from tests.device import TEST_DEVICE, TEST_DTYPE

torch.set_num_threads(1)

FAMILIES = ["builtin:tiny-qwen2-vl", "builtin:tiny-qwen2.5-vl", "builtin:tiny-llava-onevision",
            "builtin:tiny-internvl"]
MROPE = {"builtin:tiny-qwen2-vl", "builtin:tiny-qwen2.5-vl"}

_LOADED: dict[tuple[str, str, str, str], LoadedVLM] = {}


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for all builtin models of the session."""
    return tmp_path_factory.mktemp("conduit-models")


def load_builtin(name: str, cache: Path, *, attn: str = "sdpa", dtype: str | None = None,
                 device: str | None = None) -> LoadedVLM:
    """Load (once per session) a builtin model, by default on the test device and dtype."""
    dtype, device = dtype or TEST_DTYPE, device or TEST_DEVICE
    key = (name, attn, dtype, device)
    if key not in _LOADED:
        _LOADED[key] = load_vlm(name, cache_dir=cache, attn_implementation=attn, dtype=dtype,
                                device=device)
    return _LOADED[key]


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    """Each builtin family in turn."""
    name: str = request.param
    return name


@pytest.fixture
def vlm(family: str, model_cache: Path) -> LoadedVLM:
    """The family's tiny model (sdpa, on the test device and dtype)."""
    return load_builtin(family, model_cache)


@pytest.fixture
def runtime(vlm: LoadedVLM) -> ReuseRuntime:
    """A runtime over the family's tiny model."""
    return ReuseRuntime(vlm)
