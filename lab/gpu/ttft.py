"""The TTFT benchmark at real model shapes in bfloat16 on one CUDA GPU, in under 10 minutes.

Run on a GPU machine (CUDA torch, this repository's dependencies installed):
    bash lab/gpu/ttft.sh            # or: python -m lab.gpu.ttft [--model-shape 7b]
Steps, each printed with its wall time:
  1. environment: GPU name and memory, torch/CUDA versions (no GPU: exit 2 unless --device
     is given explicitly, as the CPU test of this script does);
  2. the model: Qwen2.5-VL-7B's shapes (`lab.ttft.model`, "7b") with random weights,
     initialised directly on the GPU in bfloat16 (no download);
  3. correctness first: CONDUIT at budget 1.0 from cached pages must give the full
     prefill's first-token logits within bf16 tolerance (and the same top-1); otherwise the
     script stops with exit code 1 before timing anything;
  4. the benchmark (`lab.ttft.bench.run_ttft_bench`): 8 pages x 256 visual tokens, 32-token
     question, memory / disk / redis tiers (redis only where `redis-server` is installed),
     then a page sweep 1..32 for the refresh path with peak GPU memory;
  5. outputs: lab/gpu/results/ttft_<shape>_cuda.json, .md and .png (`--out` to change).
The step budget is sized for an H100/H200-class GPU (model init ~1 min, each timed round a
few seconds); `--repeats`, `--sweep` and `--sweep-repeats` shrink it on slower parts.

Public API:
  main(argv=None) -> int
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lab import results
from lab.gpu import environment
from lab.ttft.args import DTYPE_NAMES, SHAPE_NAMES
from lab.ttft.bench import BudgetCheckError, run_ttft_bench
from lab.ttft.report import summary_lines


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, check the GPU, run the correctness check and the benchmark."""
    p = argparse.ArgumentParser(prog="python -m lab.gpu.ttft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-shape", default="7b", choices=SHAPE_NAMES)
    p.add_argument("--device", default=None, help="default: cuda (required)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_NAMES)
    p.add_argument("--pages", type=int, default=8)
    p.add_argument("--tokens-per-page", type=int, default=256)
    p.add_argument("--question-tokens", type=int, default=32)
    p.add_argument("--tier", default="memory,disk,redis")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--sweep", default="1,2,4,8,16,32")
    p.add_argument("--sweep-repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    device = args.device or "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: this script benchmarks a GPU (pass --device cpu to dry-run it)")
        return 2
    tiers = args.tier.split(",")
    if "redis" in tiers and shutil.which("redis-server") is None:
        print("redis-server not installed: the redis tier is skipped")
        tiers.remove("redis")
    t0 = time.perf_counter()
    print(f"[{time.perf_counter() - t0:6.1f}s] device: {environment(device)}", flush=True)
    out = args.out or results("gpu") / f"ttft_{args.model_shape}_{device.split(':')[0]}.json"
    try:
        doc = run_ttft_bench(
            model_shape=args.model_shape, pages=args.pages,
            tokens_per_page=args.tokens_per_page, question_tokens=args.question_tokens,
            tiers=tiers, repeats=args.repeats, warmup=args.warmup,
            pages_sweep=[int(x) for x in args.sweep.split(",")] if args.sweep else None,
            sweep_repeats=args.sweep_repeats, out=out, device=device, dtype=args.dtype,
            threads=None if device.startswith("cuda") else 1, check=True,
            command=shlex.join(["python", "-m", "lab.gpu.ttft", *argv_list]))
    except BudgetCheckError as exc:
        print(f"[{time.perf_counter() - t0:6.1f}s] CORRECTNESS CHECK FAILED: {exc}")
        return 1
    print(f"[{time.perf_counter() - t0:6.1f}s] correctness: {doc['workload']['check']}")
    print("\n".join(summary_lines(doc)))
    print(f"[{time.perf_counter() - t0:6.1f}s] wrote {out}, {out.with_suffix('.md')}"
          + (f", {out.with_suffix('.png')}" if doc.get("sweep") else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
