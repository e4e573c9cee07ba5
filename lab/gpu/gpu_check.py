"""The GPU check: can the reuse path give a wrong answer on this device, and what does it cost?

Run on a GPU machine (CUDA torch, this repository's dependencies installed) through
`bash lab/gpu/gpu_check.sh` (this check, the device-aware test suite and the TTFT bench in
one results folder, under 10 minutes), or alone:
    python -m lab.gpu.gpu_check [--device cuda] [--dtype bfloat16] [--out DIR]
It runs on the CPU too (`--device cpu`, a tiny timing model): tests/lab/test_gpu_check.py
runs it there in float32 and in bfloat16.
Steps, each printed with its wall time:
  1. environment: device, memory, torch and CUDA versions (no GPU: exit 2 unless --device
     is given);
  2. correctness (`lab.gpu.check_parts`) on the four tiny builtin families (3 pages of up
     to 64 visual tokens, so that 0.99 leaves some stale) and on the timing model: full prefill
     against the model's own forward; re-rotated page keys against keys computed afresh;
     CONDUIT at 0.1 and 0.99 against full prefill where reuse is exact (pages reused in the
     layout they were cut from; the model cut to one layer under a new prefix), and
     reported where it is not (full depth, new prefix); every score finite; device parity
     (`lab.gpu.parity`): the whole answer path at 0.1 and 0.99 with the rows CONDUIT chose
     on the CPU in float32 replayed on the device, first-token logits within the dtype's
     bound, and closer to the device's full prefill at 0.99 than at 0.1. Tolerances
     (`check_parts.TOLERANCES`, relative to the largest reference value): float32 1e-4 for
     logits and 1e-5 for keys, bfloat16 5e-2 and 2e-2, float16 1e-2 and 4e-3;
  3. timings on the timing model (Qwen2.5-VL-7B shapes with random weights on a GPU,
     "tiny" on the CPU), 8 pages x 256 visual tokens from host memory (the staged copy to
     the device included): median TTFT of full prefill, CONDUIT at 0.1 and full reuse;
     peak device memory of each (CPU: the process's peak RSS); decode tokens per second
     over 64 new tokens;
  4. a torch.profiler trace of one CONDUIT answer (trace_conduit_answer.json, Chrome trace
     format; the busiest operators in trace_ops.txt);
  5. check.json and check.md in the results folder; exit code 1 if any check failed.

Public API:
  run(args, command) -> int   (options: `lab.gpu.check_args.add_arguments`)
  main(argv=None) -> int
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from conduit_core.model.loader import load_vlm
from conduit_core.runtime import ReuseRuntime
from lab import answering, results
from lab.gpu import check_parts as parts
from lab.gpu import environment
from lab.gpu.check_args import add_arguments
from lab.gpu.parity import check_device_parity
from lab.ttft.model import bench_pages, build_bench_vlm, make_workload
from worker.settings import Settings

FAMILIES = ["builtin:tiny-qwen2-vl", "builtin:tiny-qwen2.5-vl", "builtin:tiny-llava-onevision",
            "builtin:tiny-internvl"]
PREFIX = "You answer questions about the document pages shown. Cite pages by their labels."
QUESTION = "Which region had the highest sales, and on which page is the table?"
BUDGETS = [0.1, 0.99]


def _page(seed: int, size: tuple[int, int]) -> Image.Image:
    """A deterministic noise page of `size` (width, height)."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


def _correctness(rt: ReuseRuntime, images: list[Image.Image], prefix: str, question: str,
                 one_layer: bool) -> dict[str, Any]:
    out = {"full_prefill": parts.check_full_prefill(rt, images, prefix, question),
           "rerotation": parts.check_rerotation(rt, images, prefix, question),
           "same_layout": parts.check_same_layout(rt, images, prefix, question, BUDGETS),
           "stale_quality": parts.check_stale_quality(rt, images, prefix, question, BUDGETS)}
    if one_layer:
        out["one_layer"] = parts.check_one_layer(rt.vlm, images, prefix, question,
                                                 [0.0, *BUDGETS])
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_mb(device: str) -> float:
    """Peak device memory since the last reset (CUDA), else the process's peak RSS."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _timings(rt: ReuseRuntime, pages: int, tokens: int, repeats: int,
             device: str) -> dict[str, Any]:
    """Median TTFT, peak memory and decode speed of each method (pages from host memory)."""
    images = bench_pages(pages, tokens)
    work = make_workload(rt.vlm, pages, 32)
    kvs = rt.prefill_pages(images)  # host pages, pinned where CUDA is available
    fresh = list(zip(work.labels, images, strict=True))
    methods = {
        "full_prefill": lambda n: answering.answer_full_prefill(rt,
            work.prefix, fresh, work.question,
                                                         max_new_tokens=n),
        "conduit_0.1": lambda n: answering.answer(rt, parts.request(work.prefix, kvs, work.question,
                                                         "conduit", 0.1, n)),
        "full_reuse": lambda n: answering.answer(rt, parts.request(work.prefix, kvs, work.question,
                                                        "full_reuse", 0.0, n)),
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    peaks: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for rep in range(repeats + 1):  # the first round warms up
        for name, run in methods.items():
            _sync(device)
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            res = run(1)
            _sync(device)
            peaks[name] = max(peaks.get(name, 0.0), _peak_mb(device))
            ratios[name] = res.flops_ratio_lm
            if rep:
                times[name].append(res.ttft_s)
    full = statistics.median(times["full_prefill"])
    rows = [{"method": m, "ttft_ms_median": 1e3 * statistics.median(t),
             "speedup": full / statistics.median(t), "flops_ratio_lm": ratios[m],
             "peak_mb": peaks[m], "ttft_ms_all": [1e3 * x for x in t]}
            for m, t in times.items()]
    decode = methods["conduit_0.1"](64)
    decode_s = max(decode.total_s - decode.ttft_s, 1e-9)
    return {"pages": pages, "tokens_per_page": tokens, "repeats": repeats,
            "peak_memory": "CUDA max_memory_allocated per method" if device.startswith("cuda")
            else "process peak RSS (cumulative)", "rows": rows,
            "decode": {"new_tokens": len(decode.token_ids),
                       "tokens_per_s": (len(decode.token_ids) - 1) / decode_s,
                       "stop_reason": decode.stop_reason}}


def _profile(rt: ReuseRuntime, out: Path, device: str) -> dict[str, Any]:
    """A torch.profiler trace of one CONDUIT answer (8 new tokens) and its busiest ops."""
    from torch.profiler import ProfilerActivity, profile

    work = make_workload(rt.vlm, 2, 32)
    kvs = rt.prefill_pages(bench_pages(2, 64))
    request = parts.request(work.prefix, kvs, work.question, "conduit", 0.1, 8)
    answering.answer(rt, request)  # warm
    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        answering.answer(rt, request)
        _sync(device)
    trace = out / "trace_conduit_answer.json"
    prof.export_chrome_trace(str(trace))
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    (out / "trace_ops.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=30))
    return {"trace": trace.name, "ops": "trace_ops.txt", "bytes": trace.stat().st_size}


def _markdown(doc: dict[str, Any]) -> str:
    lines = [f"# GPU check: {doc['device']} ({doc['dtype']})", "",
             f"`{doc['command']}`: **{'PASSED' if doc['passed'] else 'FAILED'}**", "",
             "| model | check | error | tolerance | passed |", "| --- | --- | ---: | ---: | --- |"]
    for model, checks in doc["correctness"].items():
        for name, c in checks.items():
            errs = [c["rel_err"]] if "rel_err" in c else [r["rel_err"] for r in c["budgets"]]
            tol = c.get("tolerance")
            lines.append(f"| {model} | {name} | {max(errs):.2e} | "
                         f"{'' if tol is None else f'{tol:.0e}'} | {c['passed']} |")
    t = doc.get("timings")
    if t:
        lines += ["", f"Timings: {t['pages']} pages x {t['tokens_per_page']} visual tokens, "
                  f"median of {t['repeats']}; peak memory: {t['peak_memory']}.", "",
                  "| method | TTFT ms | speedup | LM FLOPs ratio | peak MB |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['method']} | {r['ttft_ms_median']:.1f} | {r['speedup']:.2f} | "
                  f"{r['flops_ratio_lm']:.3f} | {r['peak_mb']:.0f} |" for r in t["rows"]]
        d = t["decode"]
        lines += ["", f"Decode: {d['tokens_per_s']:.1f} tokens/s over {d['new_tokens']} "
                  f"new tokens ({d['stop_reason']})."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.gpu.gpu_check [options]`."""
    p = argparse.ArgumentParser(prog="python -m lab.gpu.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(p.parse_args(argv), "python -m lab.gpu.gpu_check " + " ".join(argv))


def run(args: argparse.Namespace, command: str) -> int:
    """Run the checks, timings and trace; write the results folder (module docstring)."""
    device = args.device or "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: this is the GPU check (pass --device cpu to run it on the CPU)")
        return 2
    gpu = device.startswith("cuda")
    shape = args.model_shape or ("7b" if gpu else "tiny")
    pages = args.pages or (8 if gpu else 2)
    tokens = args.tokens_per_page or (256 if gpu else 16)
    out = args.out or results("gpu") / f"check_{device.split(':')[0]}_{args.dtype}"
    out.mkdir(parents=True, exist_ok=True)
    if not gpu:
        torch.set_num_threads(1)
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {text}", flush=True)

    say(f"device: {environment(device)}; dtype {args.dtype}")
    correctness: dict[str, Any] = {}
    images = [_page(1, (224, 280)), _page(2, (300, 200)), _page(3, (180, 360))]
    for name in FAMILIES:
        vlm = load_vlm(name, device=device, dtype=args.dtype, max_image_tokens=64,
                       cache_dir=Settings().model_cache_dir)
        correctness[name] = _correctness(ReuseRuntime(vlm, never_above_full=False), images,
                                         PREFIX, QUESTION, one_layer=True)
        ref = load_vlm(name, device="cpu", dtype="float32", max_image_tokens=64,
                       cache_dir=Settings().model_cache_dir)
        correctness[name]["device_parity"] = check_device_parity(
            ReuseRuntime(ref, never_above_full=False), ReuseRuntime(vlm, never_above_full=False),
            images, PREFIX, QUESTION, BUDGETS)
        say(f"{name}: " + ", ".join(f"{k} {'ok' if v['passed'] else 'FAILED'}"
                                    for k, v in correctness[name].items()))
    vlm = build_bench_vlm(shape, tokens_per_page=max(tokens, 64), device=device,
                          dtype=getattr(torch, args.dtype))
    rt = ReuseRuntime(vlm, never_above_full=False)
    say(f"timing model {shape} built")
    work = make_workload(vlm, 2, 32)
    # 2 pages of 64 visual tokens: at 0.99 one stays stale, so the scoring pass runs
    correctness[f"bench:{shape}"] = _correctness(rt, bench_pages(2, 64), work.prefix,
                                                 work.question, one_layer=not gpu)
    say(f"bench:{shape}: " + ", ".join(f"{k} {'ok' if v['passed'] else 'FAILED'}"
                                       for k, v in correctness[f"bench:{shape}"].items()))
    passed = all(c["passed"] for checks in correctness.values() for c in checks.values())
    doc: dict[str, Any] = {
        "device": environment(device), "dtype": args.dtype, "passed": passed,
        "command": command.strip(),
        "tolerances": parts.TOLERANCES[args.dtype], "budgets": BUDGETS,
        "correctness": correctness}
    if not args.skip_timings:
        doc["timings"] = _timings(ReuseRuntime(vlm), pages, tokens, args.repeats, device)
        say("timings: " + ", ".join(f"{r['method']} {r['ttft_ms_median']:.1f} ms"
                                    for r in doc["timings"]["rows"]))
        doc["profile"] = _profile(ReuseRuntime(vlm), out, device)
        say(f"profile: {out / doc['profile']['trace']}")
    (out / "check.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "check.md").write_text(_markdown(doc))
    say(f"{'PASSED' if passed else 'FAILED'}: wrote {out / 'check.json'}, {out / 'check.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
