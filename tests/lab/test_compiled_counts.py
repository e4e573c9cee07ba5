"""`bench overhead`'s compiled figures (`lab.ttft.compiled_counts`; issue 65, point 6) on the
narrow 28-layer model, compiled with `aot_eager`: a first run over 2 pages compiles its
buckets (the layers share them: a few graphs, not one a layer), a second compiles nothing,
no graph breaks, and the adapter is back to eager after; over 4 pages a row counts only the
graphs its own new buckets needed (at most one each)."""

from __future__ import annotations

import torch

from conduit_core.passes.layer_graphs import layer_graphs
from lab.ttft.compiled_counts import compiled_figures
from lab.ttft.op_count import NARROW_LAYERS, narrow_runtime


def test_compiled_figures_count_graphs_breaks_and_recompilations() -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt, kvs = narrow_runtime(4)
        two = compiled_figures(rt, kvs[:2], "conduit_per_page", "aot_eager")
        assert layer_graphs(rt.adapter) is None, "back to eager"
        again = compiled_figures(rt, kvs[:2], "conduit_per_page", "aot_eager")
        four = compiled_figures(rt, kvs[:4], "conduit_per_page", "aot_eager")
    finally:
        torch.set_num_threads(saved)
    assert 0 < two["compilations"] <= two["buckets_so_far"] < NARROW_LAYERS, two
    assert again["compilations"] == 0 and again["buckets_so_far"] == two["buckets_so_far"]
    for figures in (two, again, four):
        assert figures["recompilations"] == 0 and figures["graph_breaks"] == 0, figures
        assert figures["host_ms"] > 0 and figures["backend"] == "aot_eager"
    assert 0 < four["compilations"] <= four["buckets_so_far"] - two["buckets_so_far"], four
