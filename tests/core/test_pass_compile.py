"""The scoring pass and the refresh with their layer bodies compiled per shape bucket
(`conduit_core.passes.buckets`, `layer_graphs`; issue 65, point 2): over a grid of 60 requests
(1-8 pages, budgets 0.05-0.3, questions of 5-60 tokens, CONDUIT, the default policy and
`conduit_focus`) every layer piece runs at power-of-two rows (>= 16) and keys (>= 64) and
compiles at most once per bucket it meets (`fullgraph=True`: a graph break raises; the layers
share their graphs), the grid run again compiles nothing (`error_on_recompile`), and every first
token's logits equal the eager path's within float32 1e-5 relative, as they do for one request
of each model family. The grid compiles with `aot_eager` (dynamo and AOT autograd, no code
generation) to stay within a loaded CI's time; one request compiles with inductor, the product's
backend, and matches too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.model.loader import LoadedVLM
from conduit_core.passes.layer_graphs import compile_layers, layer_graphs
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY
from lab import answering
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import page_image

PAGES = (1, 2, 3, 5, 8, 4)
BUDGETS = (0.05, 0.1, 0.2, 0.3)
POLICIES = ("conduit", DEFAULT_POLICY, "conduit_focus")
WORDS = (4, 16, 33)  # questions of 5 to 60 tokens


@pytest.fixture(scope="module")
def vlm(model_cache: Path) -> LoadedVLM:
    return load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def kvs(vlm: LoadedVLM) -> list[PageInput]:
    rt = ReuseRuntime(vlm)
    pages = rt.prefill_pages([page_image(i) for i in range(max(PAGES))])
    return [PageInput(f"Page {i + 1}", kv) for i, kv in enumerate(pages)]


def _grid() -> list[tuple[int, float, str, str]]:
    words = "what does the table on this page say about the yearly totals and".split()
    out = []
    for i, n in enumerate(PAGES):
        for j, budget in enumerate(BUDGETS):
            for k, w in enumerate(WORDS[: 3 if (i + j) % 2 == 0 else 2]):
                question = " ".join(words[(i + j + k + m) % len(words)] for m in range(w))
                out.append((n, budget, question + "?", POLICIES[(i + j + k) % len(POLICIES)]))
    return out


def _first_logits(rt: ReuseRuntime, kvs: list[PageInput], n: int, budget: float,
                  question: str, policy: str = "conduit") -> torch.Tensor:
    request = AnswerRequest("Be brief.", kvs[:n], question, policy=choose_policy(policy),
                            budget=budget, max_new_tokens=1)
    return answering.start_answer(rt, request).decode.logits.clone()  # (V,)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def test_a_grid_compiles_once_per_bucket_and_matches_eager(vlm: LoadedVLM,
                                                           kvs: list[PageInput]) -> None:
    grid = _grid()
    assert len(grid) >= 50
    rt = ReuseRuntime(vlm, never_above_full=False, compile_passes="off")
    eager = [_first_logits(rt, kvs, *g) for g in grid]
    compile_layers(vlm.adapter, "on", backend="aot_eager")
    try:
        graphs = layer_graphs(vlm.adapter)
        assert graphs is not None
        before = counters["stats"]["unique_graphs"]
        compiled = [_first_logits(rt, kvs, *g) for g in grid]
        made = counters["stats"]["unique_graphs"] - before
        assert graphs.runs >= len(grid) * len(vlm.adapter.layers), "the passes ran compiled"
        shapes = sorted(graphs.shapes)
        assert all(_power_of_two(r) and r >= 16 and _power_of_two(k) and k >= 64
                   for _, r, k in shapes), shapes
        assert len(shapes) <= 4 * 5 * 3, shapes  # pieces x row buckets x key buckets
        assert made <= len(shapes), (made, shapes)  # at most one graph a piece and bucket
        worst = max(_close(e, c) for e, c in zip(eager, compiled, strict=True))
        assert worst <= 1e-5, worst
        with torch._dynamo.config.patch(error_on_recompile=True):
            again = [_first_logits(rt, kvs, *g) for g in grid]
        assert counters["stats"]["unique_graphs"] - before == made
        assert all(torch.equal(a, c) for a, c in zip(again, compiled, strict=True))
    finally:
        compile_layers(vlm.adapter, "off")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_compiles_and_matches_eager(family: str, model_cache: Path) -> None:
    fam = load_builtin(family, model_cache, dtype="float32", device="cpu")
    rt = ReuseRuntime(fam, never_above_full=False, compile_passes="off")
    pages = [PageInput(f"Page {i + 1}", kv)
             for i, kv in enumerate(rt.prefill_pages([page_image(i) for i in range(3)]))]
    eager = _first_logits(rt, pages, 3, 0.2, "Which page shows the totals?")
    compile_layers(fam.adapter, "on", backend="aot_eager")
    try:
        compiled = _first_logits(rt, pages, 3, 0.2, "Which page shows the totals?")
        graphs = layer_graphs(fam.adapter)
        assert graphs is not None and graphs.runs
    finally:
        compile_layers(fam.adapter, "off")
    assert _close(eager, compiled) <= 1e-5


def test_inductor_matches_eager(vlm: LoadedVLM, kvs: list[PageInput]) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False, compile_passes="off")
    eager = _first_logits(rt, kvs, 2, 0.1, "What is on the page?")
    compile_layers(vlm.adapter, "on")
    try:
        compiled = _first_logits(rt, kvs, 2, 0.1, "What is on the page?")
        graphs = layer_graphs(vlm.adapter)
        assert graphs is not None and graphs.backend == "inductor" and graphs.runs
    finally:
        compile_layers(vlm.adapter, "off")
    assert _close(eager, compiled) <= 1e-5
