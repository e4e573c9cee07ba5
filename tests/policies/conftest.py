"""Fixtures for the policy tests: one builtin tiny Qwen2-VL runtime and three cached pages of
different sizes (16, 15 and 8 visual tokens) rendered from text, on `CONDUIT_TEST_DEVICE` in
`CONDUIT_TEST_DTYPE` (default cpu, float32; `tests.device`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from conduit_core.answer_types import PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.page_kv import PageKV
from conduit_core.runtime import ReuseRuntime
from tests.device import TEST_DEVICE, TEST_DTYPE

torch.set_num_threads(1)

PAGE_SIZES = [(112, 112), (140, 84), (112, 56)]  # (width, height): 8x8, 10x6, 8x4 patches


def text_page(seed: int, size: tuple[int, int]) -> Image.Image:
    """A deterministic page of black pseudo-text lines on white."""
    gen = torch.Generator().manual_seed(seed)
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    for y in range(2, size[1] - 8, 10):
        word = "".join(chr(97 + int(c)) for c in torch.randint(0, 26, (12,), generator=gen))
        draw.text((2, y), word, fill="black")
    return img


@dataclass
class CachedPages:
    """Page images, their cached KV, and the runtime that made them."""

    runtime: ReuseRuntime
    images: list[Image.Image]
    kvs: list[PageKV]

    def inputs(self, labels: list[str]) -> list[PageInput]:
        """The cached pages with these labels."""
        return [PageInput(label, kv) for label, kv in zip(labels, self.kvs, strict=True)]

    def fresh(self, labels: list[str]) -> list[tuple[str, Image.Image]]:
        """The same pages as images (for a full prefill)."""
        return list(zip(labels, self.images, strict=True))


@pytest.fixture(scope="session")
def cached(tmp_path_factory: pytest.TempPathFactory) -> CachedPages:
    """Three text pages prefilled once by the tiny Qwen2-VL."""
    vlm = load_vlm("builtin:tiny-qwen2-vl", cache_dir=Path(tmp_path_factory.mktemp("models")),
                   device=TEST_DEVICE, dtype=TEST_DTYPE)
    runtime = ReuseRuntime(vlm, never_above_full=False)  # each policy's own path
    images = [text_page(i, size) for i, size in enumerate(PAGE_SIZES)]
    return CachedPages(runtime=runtime, images=images, kvs=runtime.prefill_pages(images))
