"""What the runtime's KV workspace saves on the CPU: a fresh cache per answer against a reused
one (`conduit_core.kv.workspace`, `ReuseRuntime(kv_workspace_bytes=...)`), side by side.

`python -m lab.ttft.kv_workspace` measures, on one torch thread:
* TTFT A/B on the default builtin (`builtin:small-qwen2-vl`), the 3-page question of
  `lab.ttft.default_model` with the default policy: two runtimes over one loaded model, one
  with `kv_workspace_bytes=0` (a fresh cache per answer, at its exact capacity: the path
  before the workspace), one with the default workspace; rounds alternate which runs first,
  medians after a warm-up round; plus the bytes the workspace holds idle afterwards;
* the cache alone: allocating one and writing its prompt's rows (what the assembly does to a
  fresh cache: on the CPU a large block is mapped afresh and faulted in as it is first
  written) against writing the same rows into a cache used before, at the default builtin's
  shape and at a 7B shape (28 layers, 4 KV heads, head dim 128, bfloat16; 8 pages of 256
  tokens: 2,150 prompt positions, a 4,096-position bucket) with plain tensors of those shapes.
Writes JSON and markdown (default lab/ttft/results/kv_workspace.{json,md}).
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.args import repeats_main
from lab.ttft.default_model import MODEL, QUESTION, a4_page
from worker.prompt import ANSWER_PREFIX, page_label

RESULTS = Path(__file__).parent / "results"
VARIANTS = ("fresh", "workspace")
SHAPE_7B = (28, 1, 4, 4096, 128)  # (L, B, kv_heads, capacity, hd)
ROWS_7B = 2150


def _ttft(rt: ReuseRuntime, request: AnswerRequest) -> tuple[float, float]:
    """One answer's prefill, then its decode: seconds to its first token's logits, on the
    wall clock and in this thread's CPU time (which leaves out waiting for a core while other
    work holds the machine)."""
    start, cpu = time.perf_counter(), time.thread_time()
    state = answering.start_answer(rt, request)
    took = time.perf_counter() - start, time.thread_time() - cpu
    answering.finish(rt, state)
    return took


def _fill_ms(shape: tuple[int, ...], rows: int, dtype: torch.dtype, repeats: int
             ) -> dict[str, float]:
    """Median ms to write `rows` positions of every layer into a fresh cache (allocated each
    time) and into one cache written before."""
    src = torch.randn(*shape[:3], rows, shape[4]).to(dtype)
    reused = torch.empty(shape, dtype=dtype)
    reused[:, :, :, :rows] = src
    times: dict[str, list[float]] = {"fresh": [], "reused": []}
    for _ in range(repeats):
        start = time.perf_counter()
        fresh = torch.empty(shape, dtype=dtype)
        fresh[:, :, :, :rows] = src
        fresh_v = torch.empty(shape, dtype=dtype)
        fresh_v[:, :, :, :rows] = src
        times["fresh"].append(time.perf_counter() - start)
        del fresh, fresh_v
        start = time.perf_counter()
        reused[:, :, :, :rows] = src
        reused[:, :, :, :rows] = src  # keys and values: the same bytes twice
        times["reused"].append(time.perf_counter() - start)
    return {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}


def run(repeats: int = 15) -> dict[str, Any]:
    """The A/B and the cache-alone figures; see the module docstring."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        vlm = load_vlm(MODEL, cache_dir=Path(tmp))
    runtimes = {"fresh": ReuseRuntime(vlm, kv_workspace_bytes=0), "workspace": ReuseRuntime(vlm)}
    kvs = runtimes["fresh"].prefill_pages([a4_page(i) for i in range(3)])
    pages = [PageInput(page_label("report.pdf", i + 1), kv) for i, kv in enumerate(kvs)]
    request = AnswerRequest(ANSWER_PREFIX, pages, QUESTION, policy=choose_policy(DEFAULT_POLICY),
                            max_new_tokens=16)
    for rt in runtimes.values():  # warm-up: heads, labels, the workspace's first cache
        _ttft(rt, request)
    got: dict[str, list[float]] = {v: [] for v in VARIANTS}  # wall
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}  # thread CPU time
    for rep in range(repeats):
        for variant in (VARIANTS if rep % 2 == 0 else VARIANTS[::-1]):
            wall, used = _ttft(runtimes[variant], request)
            got[variant].append(wall)
            cpu[variant].append(used)
    med = {v: statistics.median(t) for v, t in got.items()}
    med_cpu = {v: statistics.median(t) for v, t in cpu.items()}
    workspace = runtimes["workspace"].reuse.workspace
    state = answering.start_answer(runtimes["workspace"], request)
    assert state.lease is not None
    cache = {"capacity": state.lease.capacity, "prompt_tokens": state.layout.n,
             "bytes": 2 * state.lease.keys.numel() * state.lease.keys.element_size()}
    answering.finish(runtimes["workspace"], state)
    adapter = vlm.adapter
    default_shape = (len(adapter.layers), 1, adapter.text_config.num_key_value_heads,
                     cache["capacity"], adapter.layers[0].self_attn.head_dim)
    return {
        "model": MODEL, "policy": request.policy.name, "prompt_tokens": cache["prompt_tokens"],
        "repeats": repeats, "threads": 1,
        "ttft_ms_median": {v: round(1e3 * m, 2) for v, m in med.items()},
        "ttft_saved_ms": round(1e3 * (med["fresh"] - med["workspace"]), 2),
        "ttft_saved_ms_paired_median": round(1e3 * statistics.median(
            f - w for f, w in zip(got["fresh"], got["workspace"], strict=True)), 2),
        "ttft_ms_all": {v: [round(1e3 * t, 2) for t in ts] for v, ts in got.items()},
        "ttft_cpu_ms_median": {v: round(1e3 * m, 2) for v, m in med_cpu.items()},
        "ttft_cpu_saved_ms_paired_median": round(1e3 * statistics.median(
            f - w for f, w in zip(cpu["fresh"], cpu["workspace"], strict=True)), 2),
        "ttft_cpu_ms_all": {v: [round(1e3 * t, 2) for t in ts] for v, ts in cpu.items()},
        "workspace_cache": cache, "workspace_idle_bytes": workspace.idle_bytes,
        "fill_ms": {
            "default_builtin": {"shape": list(default_shape), "rows": cache["prompt_tokens"],
                                "dtype": "float32",
                                **_fill_ms(default_shape, cache["prompt_tokens"],
                                           torch.float32, repeats)},
            "7b_bf16_8x256": {"shape": list(SHAPE_7B), "rows": ROWS_7B, "dtype": "bfloat16",
                              "bytes": 2 * torch.Size(SHAPE_7B).numel() * 2,
                              **_fill_ms(SHAPE_7B, ROWS_7B, torch.bfloat16, repeats)}},
        "command": shlex.join(["python", "-m", "lab.ttft.kv_workspace", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d")}


def write(doc: dict[str, Any], out: Path) -> None:
    """JSON at `out`, a markdown table beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    ttft, cache = doc["ttft_ms_median"], doc["workspace_cache"]
    lines = [f"# The KV workspace on the CPU ({doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             f"`{doc['model']}`, 3 pages, {doc['prompt_tokens']} prompt tokens, policy "
             f"{doc['policy']}, one thread, medians of {doc['repeats']} alternating rounds "
             "after a warm-up.", "",
             "| variant | TTFT ms (wall) | TTFT ms (thread CPU time) |", "|---|---:|---:|",
             f"| fresh cache per answer | {ttft['fresh']} | {doc['ttft_cpu_ms_median']['fresh']} |",
             f"| workspace (reused cache) | {ttft['workspace']} | "
             f"{doc['ttft_cpu_ms_median']['workspace']} |", "",
             f"Saved: {doc['ttft_saved_ms']} ms between the medians, "
             f"{doc['ttft_saved_ms_paired_median']} ms the median of the rounds' differences "
             f"({doc['ttft_cpu_saved_ms_paired_median']} ms in CPU time). "
             f"The workspace's cache: {cache['capacity']} "
             f"positions, {cache['bytes'] / 2**20:.1f} MiB; held idle after the run: "
             f"{doc['workspace_idle_bytes'] / 2**20:.1f} MiB.", "",
             "Writing the prompt's rows of keys and values into a cache:", "",
             "| shape | rows | fresh (allocated) ms | reused ms |", "|---|---:|---:|---:|"]
    for name, r in doc["fill_ms"].items():
        lines.append(f"| {name} {r['dtype']} {r['shape']} | {r['rows']} | {r['fresh']} | "
                     f"{r['reused']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m lab.ttft.kv_workspace [--repeats 15] [--out F]`."""
    return repeats_main("lab.ttft.kv_workspace", __doc__, 15,
                        RESULTS / "kv_workspace.json", run, write, argv)


if __name__ == "__main__":
    raise SystemExit(main())
