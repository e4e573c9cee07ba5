"""Shared fixtures for conduit_core tests: builtin tiny models materialised once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from conduit_core.loader import LoadedVLM, load_vlm

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for all builtin models of the session."""
    return tmp_path_factory.mktemp("conduit-models")


_LOADED: dict[str, LoadedVLM] = {}


def load_builtin(name: str, cache: Path) -> LoadedVLM:
    """Load (once per session) a builtin model in float32 on CPU."""
    if name not in _LOADED:
        _LOADED[name] = load_vlm(name, cache_dir=cache)
    return _LOADED[name]


def page_image(seed: int, size: tuple[int, int] = (224, 280)) -> Image.Image:
    """A deterministic noisy page image."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")
