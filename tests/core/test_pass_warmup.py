"""The compiled passes warmed at startup (`conduit_core.pass_warmup`; issue 65, point 2):
after a warm-up over 1..3 pages, questions of other words and lengths, with other answer
lengths (other cache capacities), over pages like the warm-up's and with its namespace's
caches warm, compile nothing (`error_on_recompile`) and meet only warmed buckets; the warm-up
logs each page count with its buckets and seconds, stops at its time budget, and runs nothing
where the passes are eager. Compiled with `aot_eager`, as the grid test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.model.loader import LoadedVLM
from conduit_core.pass_warmup import WARMUP_NAMESPACE, WarmupSpec, warm_passes
from conduit_core.passes.layer_graphs import compile_layers, layer_graphs
from lab import answering
from tests.core.conftest import load_builtin


@pytest.fixture(scope="module")
def vlm(model_cache: Path) -> LoadedVLM:
    return load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="float32", device="cpu")


def test_after_warm_up_a_request_compiles_nothing(vlm: LoadedVLM) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False, compile_passes="off")
    blank = rt.prefill_pages([Image.new("RGB", (448, 448), "white")])[0]  # as the warm-up's
    pages = [PageInput(f"Page {i + 1}", blank) for i in range(3)]
    compile_layers(vlm.adapter, "on", backend="aot_eager")
    try:
        graphs = layer_graphs(vlm.adapter)
        assert graphs is not None
        lines = warm_passes(rt, WarmupSpec(max_pages=3, budget_s=600.0, max_new_tokens=64))
        assert len(lines) == 4 and all("bucket" in line for line in lines), lines
        warmed = set(graphs.shapes)
        assert warmed
        runs = graphs.runs
        with torch._dynamo.config.patch(error_on_recompile=True):
            for n, question, tokens in (
                    (1, "Which page shows the yearly totals?", 40),
                    (3, "What do the tables on these pages say about the costs per year?", 48),
                    (2, "What is the total of the costs in the table on this page?", 60)):
                request = AnswerRequest("", pages[:n], question, max_new_tokens=tokens,
                                        namespace=WARMUP_NAMESPACE)
                rt.release(answering.start_answer(rt, request))
        assert graphs.runs > runs, "the requests ran compiled"
        assert graphs.shapes == warmed, sorted(graphs.shapes - warmed)
    finally:
        compile_layers(vlm.adapter, "off")


def test_the_warm_up_stops_at_its_budget_and_skips_eager_passes(vlm: LoadedVLM) -> None:
    rt = ReuseRuntime(vlm, never_above_full=False, compile_passes="off")
    assert warm_passes(rt, WarmupSpec(max_pages=2, budget_s=60.0)) == [
        "pass warm-up: passes run eagerly (nothing to compile)"]
    compile_layers(vlm.adapter, "on", backend="aot_eager")
    try:
        lines = warm_passes(rt, WarmupSpec(max_pages=4, budget_s=0.0))
    finally:
        compile_layers(vlm.adapter, "off")
    assert len(lines) == 1 and "1..4 pages left" in lines[0], lines
