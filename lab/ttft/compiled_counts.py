"""Compile figures of the passes' compiled layer bodies, for `bench overhead` (issue 65, point 6).

For one runtime, policy and page count, the prefill half runs three times with the layers
compiled (`conduit_core.passes.layer_graphs`, backend chosen by the caller): the first
compiles what its buckets need, the second must compile nothing, the third is timed. Read
from dynamo's process-wide counters (`torch._dynamo.utils.counters`): graphs compiled
(`unique_graphs`) in the first run and in the second (recompilations: 0 is the aim), graph
breaks (0 is the contract: `fullgraph=True` raises on one), the first run's seconds
(compilation included) and the warm run's host ms. The adapter is switched back to eager
after each measurement.
"""

from __future__ import annotations

import time
from typing import Any

from torch._dynamo.utils import counters

from conduit_core.passes.layer_graphs import compile_layers, layer_graphs
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.op_count import answer_request


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def _breaks() -> int:
    return sum(counters["graph_break"].values())


def compiled_figures(rt: ReuseRuntime, kvs: list[Any], policy: str,
                     backend: str) -> dict[str, Any]:
    """The compiled path's figures for `policy` over `kvs` (module docstring)."""
    request = answer_request(rt.vlm, kvs, policy)

    def run() -> float:
        start = time.perf_counter()
        rt.release(answering.start_answer(rt, request))
        return time.perf_counter() - start

    compile_layers(rt.adapter, "on", backend=backend)
    try:
        graphs, breaks = _graphs(), _breaks()
        first_s = run()
        compiled = _graphs() - graphs
        again = _graphs()
        run()
        warm_ms = 1e3 * run()
        built = layer_graphs(rt.adapter)
        buckets = len(built.shapes) if built is not None else 0
        return {"backend": backend, "compilations": compiled,
                "recompilations": _graphs() - again, "graph_breaks": _breaks() - breaks,
                "buckets_so_far": buckets, "first_run_s": first_s, "host_ms": warm_ms}
    finally:
        compile_layers(rt.adapter, "off")
