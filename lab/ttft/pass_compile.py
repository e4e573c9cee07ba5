"""Eager against compiled layer bodies of the scoring pass and the refresh, on the CPU, side by
side (issue 65, point 2; `CONDUIT_COMPILE_PASSES`).

On the narrow random-weight Qwen2.5-VL (`lab.ttft.op_count.narrow_vlm`: 28 layers at hidden
64, pages of 256 tokens, one thread) a prefill's time is the host's: what it costs to issue
its operations. For each page count the default policy's prefill half
(`lab.answering.start_answer`, decode excluded) runs eagerly and with the layers compiled
(`conduit_core.passes.layer_graphs`, inductor, fullgraph), alternating, after one warm-up
run each (the compiled warm-up compiles the buckets it meets: its time and the graphs made
are reported); host ms is the median of the alternating runs. The first tokens' logits of
both are compared.

Command line: `conduit-lab bench pass-compile [--pages 2,8] [--repeats 5] [--out FILE]`.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from conduit_core.passes.layer_graphs import compile_layers, layer_graphs
from conduit_core.policies.choice import DEFAULT_POLICY
from lab import answering
from lab.ttft.op_count import answer_request, narrow_runtime

RESULTS = Path(__file__).parent / "results"


@torch.no_grad()
def run_pass_compile(pages: Sequence[int] = (2, 8), repeats: int = 5, out: Path | None = None,
                     command: str | None = None) -> dict[str, Any]:
    """Measure (module docstring); write JSON and markdown; return the JSON document."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        rt, kvs = narrow_runtime(max(pages))
        for p in pages:
            request = answer_request(rt.vlm, kvs[:p], DEFAULT_POLICY)

            def first(r: Any = request) -> torch.Tensor:
                state = answering.start_answer(rt, r)
                logits = state.decode.logits.clone()  # (V,)
                rt.release(state)
                return logits

            compile_layers(rt.adapter, "off")
            eager = first()
            compile_layers(rt.adapter, "on")
            graphs = layer_graphs(rt.adapter)
            assert graphs is not None
            shapes_before = set(graphs.shapes)
            graphs_before = counters["stats"]["unique_graphs"]
            start = time.perf_counter()
            compiled = first()
            warm_s = time.perf_counter() - start
            made = counters["stats"]["unique_graphs"] - graphs_before
            buckets = sorted({(r, k) for _, r, k in graphs.shapes - shapes_before})
            times: dict[str, list[float]] = {"eager": [], "compiled": []}
            for _ in range(repeats):
                for mode, name in (("off", "eager"), ("on", "compiled")):
                    compile_layers(rt.adapter, mode)
                    start = time.perf_counter()
                    first()
                    times[name].append(1e3 * (time.perf_counter() - start))
            eager_ms = statistics.median(times["eager"])
            compiled_ms = statistics.median(times["compiled"])
            rows.append({"pages": p, "eager_ms": eager_ms, "compiled_ms": compiled_ms,
                         "compiled_over_eager": compiled_ms / eager_ms,
                         "first_compiled_run_s": warm_s, "graphs_compiled": made,
                         "buckets": buckets,
                         "max_rel_logit_diff": float((eager - compiled).abs().max()
                                                     / eager.abs().max())})
        compile_layers(rt.adapter, "off")
    finally:
        torch.set_num_threads(saved)
    doc = {"workload": {"model": "random-weight Qwen2.5-VL, 28 layers, hidden 64, 4/2 heads",
                        "tokens_per_page": 256, "policy": DEFAULT_POLICY, "budget": 0.1,
                        "threads": 1, "repeats": repeats,
                        "machine": f"{platform.machine()} {platform.system()}, "
                                   f"torch {torch.__version__}",
                        "command": command or "conduit-lab bench pass-compile"},
           "rows": rows}
    out = Path(out) if out is not None else RESULTS / "pass_compile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(_markdown(doc))
    return doc


def _markdown(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    lines = [f"# Eager against compiled pass layers on the CPU ({w['model']}, "
             f"{w['tokens_per_page']}-token pages, one thread)", "",
             f"Command: `{w['command']}` ({w['machine']}; {w['policy']} at {w['budget']}, "
             f"median of {w['repeats']} alternating runs of the prefill half). The first "
             "compiled run compiles the buckets it meets (inductor, fullgraph: no graph "
             "break).", "",
             "| pages | eager ms | compiled ms | compiled / eager | first compiled run s | "
             "graphs | buckets (rows, keys) | logits rel diff |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in doc["rows"]:
        buckets = ", ".join(f"({a}, {b})" for a, b in r["buckets"])
        lines.append(f"| {r['pages']} | {r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | "
                     f"{r['compiled_over_eager']:.2f} | {r['first_compiled_run_s']:.1f} | "
                     f"{r['graphs_compiled']} | {buckets} | {r['max_rel_logit_diff']:.1e} |")
    lines.append("")
    return "\n".join(lines)
