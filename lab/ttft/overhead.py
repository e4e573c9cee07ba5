"""Host cost of an answer: launching ops a layer and milliseconds on the narrow model (issue 58).

On the narrow random-weight Qwen2.5-VL (`lab.ttft.op_count.narrow_vlm`: 28 layers at
hidden 64, pages of 256 tokens, one thread) the arithmetic is negligible, so the time of a
prefill is the time of issuing its operations: what a GPU answer spends on the host. For
each page count, full prefill from the cached page embeddings (`full_prefill`), CONDUIT at
10% (the default `DEFAULT_POLICY`, `conduit_per_page` and `conduit`) and full reuse run
their prefill half (`lab.answering.start_answer`, decode excluded;
`lab.ttft.op_count.count_prefill`); reported
per layer: the operations of the whole prefill half, of its passes alone (scoring pass,
refresh, logits) and of its page load (`load_pages`), counted on an accelerator's path
(`lab.ttft.op_count.accelerator_path`), the page load's also on the CPU's own path (each
page turned in place), and the median wall time of `repeats` runs on the CPU's path (warm
caches, counting off). A decode step of one answer over the largest page count is measured
the same way. The page load alone is timed on both paths side by side (`page_load`: the
CPU's in place against an accelerator's joined path run on the CPU).

Beside the float32 counts, each row gives the prefill half's launching ops a layer with the
model in bfloat16 (the dtype a GPU runs; a second narrow runtime) and its host reads from
the first page copy to the first token's logits (`lab.ttft.host_syncs.count_prefill_syncs`,
on the accelerator's path: 0 is the aim, issue 65); the decode step gives its bf16 ops and
the host reads of a batched step of 1 and 16 streams (`count_step_syncs`: 1 is the aim).
These figures are of the eager path. Beside them each row gives the compiled layer bodies'
figures (`lab.ttft.compiled_counts`, `compile_backend`, inductor by default): graphs
compiled by its first run (new buckets only: the rows share the graphs compiled before),
recompilations and graph breaks (0 is the aim), the first run's seconds and the warm host ms;
`lab.ttft.pass_compile` times compiled against eager at more repeats. Each row also gives
the bf16 prefill half's launches a layer on the compiled path (`compiled_launches`, on the
bf16 runtime, inductor: generated kernels, the aten operations the compiled code dispatches,
the eager operations around the layer bodies), the figure issue 65's bound is judged on
for a GPU.

Public API:
  run_overhead(pages=(2, 8, 32), repeats=5, out=None, command=None,
               compile_backend="inductor") -> dict
      JSON at `out` (default lab/ttft/results/overhead.json) and markdown beside it
Command line: `conduit-lab bench overhead [--pages 2,8,32] [--repeats 5] [--out FILE]
[--compile-backend inductor|aot_eager]`.
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

from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.page_loads import load_pages
from conduit_core.policies.choice import DEFAULT_POLICY
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.compiled_counts import CompiledLaunches, compiled_figures, compiled_launches
from lab.ttft.host_syncs import count_prefill_syncs, count_step_syncs
from lab.ttft.op_count import (
    NARROW_LAYERS,
    accelerator_path,
    answer_request,
    count_ops,
    count_prefill,
    narrow_runtime,
)

RESULTS = Path(__file__).parent / "results"
POLICIES = ("full_prefill", DEFAULT_POLICY, "conduit_per_page", "conduit", "full_reuse")
DECODE_STEPS = 8  # tokens decoded before the measured step
SYNC_STREAMS = (1, 16)  # batched decode steps whose host reads are counted


def _median_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


@torch.no_grad()
def run_overhead(pages: Sequence[int] = (2, 8, 32), repeats: int = 5, out: Path | None = None,
                 command: str | None = None, compile_backend: str = "inductor"
                 ) -> dict[str, Any]:
    """Measure (module docstring); write JSON and markdown; return the JSON document."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt, kvs = narrow_runtime(max(pages))
        half, half_kvs = narrow_runtime(max(pages), dtype=torch.bfloat16)
        rows = []
        for policy in POLICIES:
            for p in pages:
                count = count_prefill(rt, kvs[:p], policy)
                bf16 = count_prefill(half, half_kvs[:p], policy)
                with accelerator_path():
                    syncs = count_prefill_syncs(rt, kvs[:p], policy)
                ms = _median_ms(lambda r=count.request: rt.release(
                    answering.start_answer(rt, r)), repeats)
                rows.append({"method": policy, "pages": p,
                             "ops_per_layer": count.ops.total / NARROW_LAYERS,
                             "bf16_ops_per_layer": bf16.ops.total / NARROW_LAYERS,
                             "host_syncs": syncs.total, "sync_sites": dict(syncs.sites),
                             "pass_ops_per_layer": count.passes / NARROW_LAYERS,
                             "load_ops_per_layer": count.load / NARROW_LAYERS,
                             "cpu_load_ops_per_layer": count.cpu_load / NARROW_LAYERS,
                             "host_ms": ms,
                             "compiled": compiled_figures(rt, kvs[:p], policy,
                                                          compile_backend),
                             "compiled_bf16": _launches(compiled_launches(
                                 half, half_kvs[:p], policy)),
                             "top_ops": dict(count.ops.by_name.most_common(8))})
        decode = _decode_step(rt, kvs, repeats)
        decode["bf16_ops_per_layer"] = _decode_step(half, half_kvs, 1)["ops_per_layer"]
        with accelerator_path():
            decode["host_syncs"] = {str(n): count_step_syncs(rt, kvs[:2], n).total
                                    for n in SYNC_STREAMS}
        loads = [_page_load(rt, kvs[:p], repeats) for p in pages]
    finally:
        torch.set_num_threads(saved)
    doc = {"workload": {"model": "random-weight Qwen2.5-VL, 28 layers, hidden 64, 4/2 heads",
                        "tokens_per_page": 256, "pages": list(pages), "repeats": repeats,
                        "threads": 1, "budget": 0.1, "compile_backend": compile_backend,
                        "machine": f"{platform.machine()} {platform.system()}, "
                                   f"torch {torch.__version__}",
                        "command": command or "conduit-lab bench overhead"},
           "rows": rows, "decode_step": decode, "page_load": loads}
    out = Path(out) if out is not None else RESULTS / "overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(_markdown(doc))
    return doc


def _launches(count: CompiledLaunches) -> dict[str, Any]:
    """A prefill half's launches on the compiled path, a layer."""
    return {"launches_per_layer": count.total / NARROW_LAYERS,
            "kernels_per_layer": count.kernels / NARROW_LAYERS,
            "extern_per_layer": sum(count.extern.values()) / NARROW_LAYERS,
            "eager_per_layer": sum(count.eager.values()) / NARROW_LAYERS,
            "recompilations": count.recompilations,
            "top_eager": dict(count.eager.most_common(8)), "extern": dict(count.extern)}


def _decode_step(rt: ReuseRuntime, kvs: list[Any], repeats: int) -> dict[str, Any]:
    """Ops and median ms of one decode step of one answer over all the pages."""
    request = answer_request(rt.vlm, kvs, DEFAULT_POLICY)
    request = type(request)(request.prefix, request.pages, request.question,
                            policy=request.policy, budget=request.budget,
                            max_new_tokens=DECODE_STEPS + repeats + 2)
    state = answering.start_answer(rt, request)
    for _ in range(DECODE_STEPS):
        rt.step([state])
    _, counter = count_ops(lambda: rt.step([state]))
    ms = _median_ms(lambda: rt.step([state]), repeats)
    rt.release(state)
    return {"pages": len(kvs), "ops_per_layer": counter.total / NARROW_LAYERS,
            "host_ms": ms, "top_ops": dict(counter.by_name.most_common(12))}


def _page_load(rt: ReuseRuntime, kvs: list[Any], repeats: int) -> dict[str, Any]:
    """Median ms of `load_pages` alone over `kvs`, on the CPU's path and on the joined one
    (alternating, `3 * repeats` runs each)."""
    request = answer_request(rt.vlm, kvs, "full_reuse")
    layout = rt.reuse.assemble(request.prefix, request.pages, request.question).layout
    cache = KVCache.allocate(rt.adapter, 1, layout.n)
    embeds = rt.adapter.embed_tokens(layout.token_ids)  # (N, hidden)

    def load() -> None:
        load_pages(rt.adapter, layout, kvs, cache, embeds)

    def joined() -> None:
        with accelerator_path():
            load()

    times: dict[str, list[float]] = {"in_place": [], "joined": []}
    for _ in range(3 * repeats):
        times["in_place"].append(_median_ms(load, 1))
        times["joined"].append(_median_ms(joined, 1))
    in_place, join = statistics.median(times["in_place"]), statistics.median(times["joined"])
    return {"pages": len(kvs), "in_place_ms": in_place, "joined_ms": join,
            "joined_over_in_place": join / in_place}


def _markdown(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    lines = [f"# Host cost on the narrow model ({w['model']}, {w['tokens_per_page']}-token "
             f"pages, one thread)", "", f"Command: `{w['command']}` ({w['machine']}; median "
             f"of {w['repeats']} runs). Ops: aten operations that launch work "
             "(`lab.ttft.op_count`), on an accelerator's path (`accelerator_path`); passes: "
             "scoring pass, refresh and logits alone; page load: `load_pages`; CPU page "
             "load: the same on the CPU's own path (each page turned in place); host ms: the "
             "CPU's path; bf16: the same ops with the model in bfloat16; host syncs: reads "
             "of device values from the first page copy to the first token's logits "
             "(`lab.ttft.host_syncs`, accelerator's path). These are eager; compiled: the "
             "layer bodies compiled (`compiled_counts`): graphs its first run compiled (new "
             "buckets), recompilations on a second run, graph breaks, the warm host ms; "
             "compiled bf16 launches: the bf16 prefill half with the layer bodies compiled by "
             "inductor, on the accelerator's path (`compiled_launches`), a layer: inductor's "
             "generated kernels + the aten operations the compiled code dispatches (matmuls, "
             "sdpa) + the aten operations run eagerly around the layer bodies.", "",
             "| method | pages | ops a layer | bf16 ops a layer | of which passes | of which "
             "page load | CPU page load | host syncs | host ms | compiled: graphs / "
             "recompiled / breaks | compiled host ms | compiled bf16 launches a layer "
             "(kernels + extern + eager) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: |"]
    for r in doc["rows"]:
        c, b = r["compiled"], r["compiled_bf16"]
        lines.append(f"| {r['method']} | {r['pages']} | {r['ops_per_layer']:.1f} | "
                     f"{r['bf16_ops_per_layer']:.1f} | "
                     f"{r['pass_ops_per_layer']:.1f} | {r['load_ops_per_layer']:.1f} | "
                     f"{r['cpu_load_ops_per_layer']:.1f} | {r['host_syncs']} | "
                     f"{r['host_ms']:.1f} | {c['compilations']} / {c['recompilations']} / "
                     f"{c['graph_breaks']} | {c['host_ms']:.1f} | "
                     f"{b['launches_per_layer']:.1f} ({b['kernels_per_layer']:.1f} + "
                     f"{b['extern_per_layer']:.1f} + {b['eager_per_layer']:.1f}) |")
    d = doc["decode_step"]
    syncs = ", ".join(f"{n} at {s} stream{'s' if int(s) > 1 else ''}"
                      for s, n in d["host_syncs"].items())
    lines += ["", f"Decode step (one answer, {d['pages']} pages, eager): {d['ops_per_layer']:.1f} "
              f"ops a layer ({d['bf16_ops_per_layer']:.1f} in bf16), {d['host_ms']:.2f} ms; "
              f"host syncs of a batched step: {syncs}.", "",
              "Page load alone on the CPU (median ms, alternating runs): each page turned in "
              "place (the CPU's path) against the pages joined first (an accelerator's path).",
              "", "| pages | in place ms | joined ms | joined / in place |",
              "| ---: | ---: | ---: | ---: |"]
    for r in doc["page_load"]:
        lines.append(f"| {r['pages']} | {r['in_place_ms']:.2f} | {r['joined_ms']:.2f} | "
                     f"{r['joined_over_in_place']:.2f} |")
    lines.append("")
    return "\n".join(lines)
