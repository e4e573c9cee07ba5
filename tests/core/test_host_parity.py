"""The prefill half's host work, batched over pages, gives what its loops over pages gave.

Each loop is kept here, and only here, as the reference:
* M-RoPE position ids (`qwen2_vl.mrope_positions`, the Qwen2-VL and Qwen2.5-VL adapters'
  `position_ids`) equal the model's own `get_rope_index` over random layouts (text runs,
  images of random grids, one or two frames, an image first or last, no image at all), and
  a layout whose image runs do not match its grids is refused;
* the label loads (`label_cache.write_labels`, all labels at once) leave in the cache the same
  bytes as turning and copying each label on its own, and refuse a label whose positions do
  not shift uniformly, as the loop did;
* `Assembly.page_attention` (one scatter over the pages) equals the peak of each page's rows
  taken page by page.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.errors import ConduitCoreError
from conduit_core.kv.kv_cache import KVCache
from conduit_core.label_cache import LabelKV, _pending, fetch, write_labels
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.model.adapters.qwen2_vl import mrope_positions
from conduit_core.passes.assembly import Assembly
from conduit_core.prompt.layout import Layout, Segment
from conduit_core.prompt.rotation import rerotate_into, shift_cos_sin
from tests.core.conftest import MROPE, load_builtin
from tests.core.helpers import IMAGES, segment_delta


def _rope_index_loop(vlm: Any, token_ids: torch.Tensor,
                     grids: list[torch.Tensor]) -> torch.Tensor:
    """The adapter's position ids before: the model's own index, image by image (3, N)."""
    adapter = vlm.adapter
    ids = token_ids.view(1, -1)  # (1, N)
    if not grids:
        return torch.arange(ids.shape[1]).view(1, -1).expand(3, -1)
    mm = (ids == adapter.image_token_id).to(torch.int)  # (1, N)
    pos, _ = vlm.model.model.get_rope_index(ids, mm_token_type_ids=mm,
                                            image_grid_thw=torch.stack(grids))
    return pos[:, 0].cpu()  # (3, N)


def _random_layout(rng: random.Random, image_id: int, merge: int
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Token ids with 0-6 images of random grids between text runs (possibly none first or
    last) and their grids."""
    words = [t for t in range(1, 40) if t != image_id]  # text tokens
    pieces: list[int] = []
    grids = []
    images = rng.randint(0, 6)
    for i in range(images):
        if i > 0 or rng.random() < 0.8:  # text between images; sometimes an image first
            pieces += rng.choices(words, k=rng.randint(1, 9))
        t, h, w = rng.choice([1, 1, 1, 2]), merge * rng.randint(1, 5), merge * rng.randint(1, 7)
        grids.append(torch.tensor([t, h, w]))
        pieces += [image_id] * (t * h * w // merge**2)
    if not images or rng.random() < 0.8:
        pieces += rng.choices(words, k=rng.randint(1, 9))
    return torch.tensor(pieces, dtype=torch.long), grids


@pytest.mark.parametrize("family", sorted(MROPE))
def test_mrope_positions_equal_the_models_own_index(family: str, model_cache: Path) -> None:
    vlm = load_builtin(family, model_cache, device="cpu")
    adapter = vlm.adapter
    merge = int(vlm.model.config.vision_config.spatial_merge_size)
    rng = random.Random(sorted(MROPE).index(family))
    for _ in range(60):
        ids, grids = _random_layout(rng, adapter.image_token_id, merge)
        expected = _rope_index_loop(vlm, ids, grids)
        got = adapter.position_ids(ids, grids).cpu()
        assert got.dtype == torch.long and torch.equal(got, expected), (ids.tolist(), grids)


def test_mrope_positions_refuse_runs_that_do_not_match_the_grids() -> None:
    image = 9
    ids = torch.tensor([1, 2, image, image, image, image, 3])
    grid = torch.tensor([1, 4, 4])  # 4 tokens after a 2x2 merge
    assert mrope_positions(ids, [grid], image, 2)[:, -1].tolist() == [4, 4, 4]  # 2 + max(2, 2)
    with pytest.raises(ValueError, match="runs of image tokens"):
        mrope_positions(ids, [grid, grid], image, 2)  # two grids, one run
    with pytest.raises(ValueError, match="runs of image tokens"):
        mrope_positions(ids, [torch.tensor([1, 4, 6])], image, 2)  # 6 tokens, 4 in the run


def _copy_labels_loop(adapter: VLMAdapter, cache: KVCache, spans: list[Segment],
                      labels: list[LabelKV], position_ids: torch.Tensor) -> None:
    """The label loads before: each label turned by its own shift and copied on its own."""
    for span, label in zip(spans, labels, strict=True):
        rows = slice(span.start, span.stop)
        delta = segment_delta(label.position_ids, position_ids[:, rows])
        cos, sin = shift_cos_sin(adapter, delta, label.keys.device)  # (hd,) each
        rerotate_into(label.keys, cos.view(1, -1), sin.view(1, -1), cache.keys[:, 0, :, rows])
        cache.values[:, 0, :, rows] = label.values


def _assembled(rt: ReuseRuntime, n_pages: int) -> tuple[Assembly, list[Segment],
                                                        list[LabelKV]]:
    """An assembly of `n_pages` pages with labels of different lengths, not filled yet."""
    kvs = rt.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    names = ["[a.pdf p.1]", "[annual report 2025.pdf p.12]", "[b p.3]", "[c.pdf p.100]"]
    pages = [PageInput(names[i % len(names)] + " " * (i // len(names)), kvs[i % len(kvs)])
             for i in range(n_pages)]
    asm = rt.reuse.assemble("Answer from the pages.", pages, "What is shown?", labels=False)
    assert asm.head is not None and asm.labels_pending
    pending = _pending(asm, None)
    labels = [fetch(rt.reuse.labels, rt.adapter, rt.reuse.costs, "", asm.head, ids)[0]  # type: ignore[arg-type]
              for _, ids in pending]
    return asm, [span for span, _ in pending], labels


@pytest.mark.parametrize("n_pages", [1, 7])
def test_label_loads_equal_the_per_label_loop(runtime: ReuseRuntime, n_pages: int) -> None:
    asm, spans, labels = _assembled(runtime, n_pages)
    assert len(spans) == n_pages and len({s.length for s in spans}) > (n_pages > 1)
    position_ids = asm.layout.position_ids
    expected = KVCache(asm.cache.keys.clone(), asm.cache.values.clone())
    _copy_labels_loop(runtime.adapter, expected, spans, labels, position_ids)
    write_labels(runtime.adapter, asm.cache, spans, labels, position_ids)
    for got, want in ((asm.cache.keys, expected.keys), (asm.cache.values, expected.values)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))  # bytes: NaN-safe


def test_label_loads_refuse_a_non_uniform_shift(runtime: ReuseRuntime) -> None:
    asm, spans, labels = _assembled(runtime, 3)
    moved = asm.layout.position_ids.clone()
    moved[0, spans[1].start + 1] += 1  # one token of the second label off by one
    with pytest.raises(ConduitCoreError, match="shift uniformly"):
        _copy_labels_loop(runtime.adapter, asm.cache, spans, labels, moved)
    with pytest.raises(ConduitCoreError, match="shift uniformly"):
        write_labels(runtime.adapter, asm.cache, spans, labels, moved)


def _page_attention_loop(attention: torch.Tensor, layout: Layout) -> tuple[float, ...]:
    totals = [float(attention[s.start:s.stop].max()) for s in layout.segments]
    whole = sum(totals)
    return tuple(t / whole for t in totals) if whole > 0 else ()


def test_page_attention_equals_the_per_page_peaks() -> None:
    rng = random.Random(3)
    for case in range(40):
        segments, start = [], rng.randint(1, 5)
        for page in range(rng.randint(1, 12)):
            segments.append(Segment(start, rng.randint(1, 30), page))
            start = segments[-1].stop + rng.randint(0, 4)
        n = start + 2
        layout = Layout(token_ids=torch.zeros(n, dtype=torch.long),
                        position_ids=torch.zeros(3, n, dtype=torch.long), segments=segments,
                        question_start=start)
        gen = torch.Generator().manual_seed(case)
        attention = torch.rand(n, generator=gen) * (case % 4 != 0)  # some all zero
        attention[torch.randint(0, n, (n // 4,), generator=gen)] = 0.5  # ties
        none: Any = None
        asm = Assembly(layout=layout, cache=none, embeds=none, image_grids=[],
                       stale=SimpleNamespace(attention=attention))  # type: ignore[arg-type]
        assert asm.page_attention() == _page_attention_loop(attention, layout)
