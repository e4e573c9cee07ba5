"""MMLongBench-Doc answer accuracy on one CUDA GPU with a local checkpoint, in under 10 minutes.

Run on a GPU machine (CUDA torch, this repository's dependencies installed, the dev set at
../shared/devsets/mmlongbench-dev beside the repository):
    bash lab/gpu/answers.sh /models/Qwen2.5-VL-7B-Instruct     # or a Qwen2-VL-2B folder
Steps, each printed with its wall time:
  1. environment: GPU name and memory (no GPU: exit 2 unless --device is given explicitly,
     as the CPU test of this script does);
  2. `conduit-lab eval answers` in the paper's setting (`lab.answers`): gold evidence
     pages (at most --max-pages), policies conduit, cacheblend, epic, vlcache, random and
     full_reuse at budgets 0.05 / 0.1 / 0.2, the first --limit questions (100) of the dev
     set, bfloat16; the correctness check runs first, on the first question (CONDUIT at
     budget 1.0 from cached pages must give full prefill's first-token logits within bf16
     tolerance and the same top-1), and a failure stops the script with exit code 1;
  3. outputs: lab/gpu/results/answers_<model>_gold_<device>.json, .md and .png (--out to
     change) and the records file beside them (a rerun resumes).
Only the documents the selected questions name are ingested, without OCR, and only the
pages they use are prefilled, so the GPU time goes to answers.

Public API:
  main(argv=None) -> int
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from conduit_core.policies import POLICIES
from lab import DEVSET, results
from lab.answers.config import AnswerEvalConfig
from lab.answers.runner import BudgetOneError, run_answer_eval
from lab.gpu import environment

# the set; VLCache's rule (first floor(rho * T_m) tokens of each page) is registered as
# `vlcache` or, after its rename, `epic_proportional`: whichever this checkout has
PAPER_POLICIES = ",".join(p for p in ("conduit", "cacheblend", "epic", "vlcache",
                                      "epic_proportional", "random", "full_reuse")
                          if p in POLICIES)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, check the GPU, run the evaluation (correctness check first)."""
    p = argparse.ArgumentParser(prog="python -m lab.gpu.answers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="local checkpoint folder (or a builtin:tiny-* model)")
    p.add_argument("--device", default=None, help="default: cuda (required)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--pdfs", type=Path, default=DEVSET / "pdfs")
    p.add_argument("--questions", type=Path, nargs="+",
                   default=[DEVSET / "questions.jsonl", DEVSET / "questions_unanswerable.jsonl"])
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--policies", default=PAPER_POLICIES)
    p.add_argument("--budgets", default="0.05,0.1,0.2")
    p.add_argument("--max-pages", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-page-tokens", type=int, default=None)
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    device = args.device or "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: this script evaluates on a GPU (pass --device cpu to dry-run it)")
        return 2
    t0 = time.perf_counter()
    print(f"[{time.perf_counter() - t0:6.1f}s] device: {environment(device)}", flush=True)
    name = Path(args.model.removeprefix("builtin:")).name
    kind = device.split(":")[0]
    out = args.out or results("gpu") / f"answers_{name}_gold_{kind}.json"
    cfg = AnswerEvalConfig(
        pdfs=args.pdfs, questions=args.questions, out=out, model=args.model, device=device,
        dtype=args.dtype, policies=args.policies,
        budgets=[float(b) for b in args.budgets.split(",") if b.strip()], pages="gold",
        max_pages=args.max_pages, limit=args.limit, max_new_tokens=args.max_new_tokens,
        max_page_tokens=args.max_page_tokens, work_dir=args.work_dir, check_budget_one=True,
        command=shlex.join(["bash", "lab/gpu/answers.sh", *argv_list]),
        extra={"environment": environment(device)})
    try:
        doc = run_answer_eval(cfg)
    except BudgetOneError as exc:
        print(f"[{time.perf_counter() - t0:6.1f}s] CORRECTNESS CHECK FAILED: {exc}")
        return 1
    except ValueError as exc:
        print(f"[{time.perf_counter() - t0:6.1f}s] {exc}")
        return 2
    print(f"[{time.perf_counter() - t0:6.1f}s] correctness: {doc['meta']['budget_one_check']}")
    for r in doc["rows"]:
        if r["group"] == "all":
            print(f"  {r['policy']:14s} {r['budget']:.2f}  acc={r['accuracy']:.3f}  "
                  f"ratio={r['accuracy_ratio_to_full']}  agree={r['agreement_with_full']:.3f}"
                  f"  flops_lm={r['flops_ratio_lm']:.3f}  ttft={r['ttft_ms_median']:.1f}ms")
    print(f"[{time.perf_counter() - t0:6.1f}s] wrote {out}, {out.with_suffix('.md')}, "
          f"{out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
