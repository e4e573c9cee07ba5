"""Compile figures of the passes' compiled layer bodies, for `bench overhead` (issue 65, point 6).

For one runtime, policy and page count, the prefill half runs three times with the layers
compiled (`conduit_core.passes.layer_graphs`, backend chosen by the caller): the first
compiles what its buckets need, the second must compile nothing, the third is timed. Read
from dynamo's process-wide counters (`torch._dynamo.utils.counters`): graphs compiled
(`unique_graphs`) in the first run and in the second (recompilations: 0 is the aim), graph
breaks (0 is the contract: `fullgraph=True` raises on one), the first run's seconds
(compilation included) and the warm run's host ms. The adapter is switched back to eager
after each measurement.

Launches of the compiled path (`compiled_launches`): the prefill half on the accelerator's
path (`lab.ttft.op_count.accelerator_path`) with the layer bodies compiled by inductor, its
graphs compiled by two runs ahead, counted on the third. Three kinds of launch: the kernels
inductor generated (each a C++ function on the CPU, a Triton kernel on CUDA: one launch a
call; counted as the profiler's events of `torch._inductor.config.cpp.enable_kernel_profile`,
on while the graphs compile), the operations the compiled code dispatches to aten (`extern`:
matmuls, sdpa, what inductor does not generate: one launch each, cuBLAS' and the attention
kernels' own), and the aten operations run eagerly around the compiled layer bodies (page
load, layout, selection, the scoring pass's probabilities, logits), counted as
`lab.ttft.op_count.OpCounter` counts the eager path. A dispatch-mode counter lets compiled
code run when it says it ignores compile internals (dynamo skips compilation under any
other mode); an operation is the compiled code's where a frame of dynamo's compiled-call
wrapper is on the Python stack.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch._dynamo import eval_frame
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

from conduit_core.page_kv import PageKV
from conduit_core.passes.layer_graphs import compile_layers, layer_graphs
from conduit_core.policies.choice import PolicyChoice
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.op_count import LAUNCH_FREE, OpCounter, accelerator_path, answer_request, op_name

KERNEL_MARK = "cpp_fused"  # in the name of every kernel inductor generates for the CPU


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


def _in_compiled_code(frame: FrameType | None) -> bool:
    """Whether dynamo's compiled-call wrapper is on the stack at `frame` or above it."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "compile_wrapper" and code.co_filename == eval_frame.__file__:
            return True
        frame = frame.f_back
    return False


class LaunchCounter(OpCounter):
    """An `OpCounter` under which compiled code runs (module docstring): `.by_name` counts
    the operations run eagerly, `.extern` those the compiled code dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.extern: Counter[str] = Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let dynamo run compiled code under this mode."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if not _in_compiled_code(sys._getframe(1)):
            return super().__torch_dispatch__(func, types, args, kwargs)
        name = op_name(func)
        if name not in LAUNCH_FREE:
            self.extern[name] += 1
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class CompiledLaunches:
    """The launches of one prefill half on the compiled path (module docstring)."""

    kernels: int  # inductor's generated kernels run
    extern: Counter[str]  # aten operations the compiled code dispatched
    eager: Counter[str]  # aten operations run eagerly around the compiled layer bodies
    pieces: int  # compiled layer pieces run
    recompilations: int  # graphs compiled by the counted run (0: every bucket warm)

    @property
    def total(self) -> int:
        """Every launch."""
        return self.kernels + sum(self.extern.values()) + sum(self.eager.values())


@torch.no_grad()
def compiled_launches(rt: ReuseRuntime, kvs: list[PageKV],
                      policy: str | PolicyChoice) -> CompiledLaunches:
    """The launches of the prefill half of the TTFT workload's request over `kvs` under
    `policy` with the layer bodies compiled by inductor (module docstring); head and labels
    computed ahead. The graphs must compile here, with kernel profiling on: an adapter
    compiled before without it would show no kernel (raises)."""
    request = answer_request(rt.vlm, kvs, policy)
    answering.warm_labels(rt, request.prefix, request.pages)

    def run() -> None:
        rt.release(answering.start_answer(rt, request))

    compile_layers(rt.adapter, "on", backend="inductor")
    try:
        with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}), \
                accelerator_path():
            run()  # compiles the buckets it meets
            run()  # warms the choice history, as in service
            graphs, built = _graphs(), layer_graphs(rt.adapter)
            assert built is not None
            runs = built.runs
            counter = LaunchCounter()
            with profile(activities=[ProfilerActivity.CPU]) as prof, counter:
                run()
        kernels = sum(1 for event in prof.events() if KERNEL_MARK in event.name)
        pieces = built.runs - runs
        if pieces and not kernels:
            raise RuntimeError("compiled pieces ran but no kernel was seen: the graphs were "
                               "compiled without inductor's kernel profiling")
        return CompiledLaunches(kernels, counter.extern, counter.by_name, pieces,
                                _graphs() - graphs)
    finally:
        compile_layers(rt.adapter, "off")
