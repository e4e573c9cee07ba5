"""Shared fixtures for conduit_core tests: builtin tiny models materialised once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core.loader import LoadedVLM, load_vlm
from conduit_core.runtime import ReuseRuntime

torch.set_num_threads(1)

FAMILIES = ["builtin:tiny-qwen2-vl", "builtin:tiny-qwen2.5-vl", "builtin:tiny-llava-onevision",
            "builtin:tiny-internvl"]
MROPE = {"builtin:tiny-qwen2-vl", "builtin:tiny-qwen2.5-vl"}

_LOADED: dict[tuple[str, str, str], LoadedVLM] = {}


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for all builtin models of the session."""
    return tmp_path_factory.mktemp("conduit-models")


def load_builtin(name: str, cache: Path, *, attn: str = "sdpa",
                 dtype: str = "float32") -> LoadedVLM:
    """Load (once per session) a builtin model on CPU."""
    key = (name, attn, dtype)
    if key not in _LOADED:
        _LOADED[key] = load_vlm(name, cache_dir=cache, attn_implementation=attn, dtype=dtype)
    return _LOADED[key]


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    """Each builtin family in turn."""
    name: str = request.param
    return name


@pytest.fixture
def vlm(family: str, model_cache: Path) -> LoadedVLM:
    """The family's tiny model (float32, sdpa)."""
    return load_builtin(family, model_cache)


@pytest.fixture
def runtime(vlm: LoadedVLM) -> ReuseRuntime:
    """A runtime over the family's tiny model."""
    return ReuseRuntime(vlm)
