"""Peak memory of the scoring pass and decode time per token, on the TTFT bench's model.

The scoring pass used to keep every layer's question-row probabilities, (L, H, Q, N) float32;
it now reduces them layer by layer into two (N,) scores. This script measures its peak memory
over layer counts, page counts and question lengths, and the decode loop's time per token
(it used to re-detokenize the whole output every step). It uses only APIs that existed
before those changes, so the same file runs on the old commit for the "before" column
(`git worktree add /tmp/old <commit>`, copy this file there, run it from there).

Model: the TTFT bench's "cpu" shape (`lab.ttft.model`: hidden 512, 8/2 heads, d_ff 2752)
with its layer count overridden; pages of `tokens_per_page` visual tokens reused under a new
prefix with a question of `question_tokens` tokens. Memory: CPU peak RSS above the RSS before
the call (`lab.ttft.bench.PeakMemory`); time per token: (total - time to first token) / (tokens
- 1) of a greedy answer with stop tokens disabled, full_reuse policy, median of `repeats`.

Public API:
  run_core_costs(*, layers=(8, 32), pages=(4, 16), questions=(32, 256), tokens_per_page=256,
                 decode_tokens=128, repeats=3, label="", out=None) -> dict
  main(argv=None) -> int        `python -m lab.ttft.core_costs --help`
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.bench import PeakMemory
from lab.ttft.model import SHAPES, bench_pages, build_bench_vlm, make_workload


def _runtime(layers: int, tokens_per_page: int) -> ReuseRuntime:
    base = SHAPES["cpu"]
    name = f"cpu-L{layers}"
    SHAPES[name] = replace(base, text={**base.text, "num_hidden_layers": layers})
    return ReuseRuntime(build_bench_vlm(name, tokens_per_page=tokens_per_page))


def _scoring_peak(rt: ReuseRuntime, pages: list[PageInput], prefix: str,
                  question: str) -> tuple[float, int]:
    """Peak MB of one scoring pass over a fresh assembly, and the prompt length."""
    asm = rt.reuse.assemble(prefix, pages, question)
    peak = PeakMemory(rt.adapter.device)
    with torch.no_grad(), peak:
        result = rt.reuse.scoring(asm)
    del result
    return (peak.peak or 0) / 2**20, asm.layout.n


def _decode_ms(rt: ReuseRuntime, pages: list[PageInput], prefix: str, question: str,
               tokens: int, repeats: int) -> float:
    """Median ms per generated token after the first (stop tokens disabled)."""
    saved = rt.reuse.stop_ids
    rt.reuse.stop_ids = []
    try:
        times = []
        for _ in range(repeats):
            res = answering.answer(rt, AnswerRequest(prefix, pages, question,
                                                     policy=choose_policy("full_reuse"),
                                          max_new_tokens=tokens))
            times.append((res.total_s - res.ttft_s) / max(1, len(res.token_ids) - 1))
    finally:
        rt.reuse.stop_ids = saved
    return 1e3 * statistics.median(times)


def run_core_costs(*, layers: Sequence[int] = (8, 32), pages: Sequence[int] = (4, 16),
                   questions: Sequence[int] = (32, 256), tokens_per_page: int = 256,
                   decode_tokens: int = 128, repeats: int = 3, label: str = "",
                   out: Path | None = None) -> dict[str, Any]:
    """Measure (see the module docstring); write JSON to `out` when given."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    decode: list[dict[str, Any]] = []
    for n_layers in layers:
        rt = _runtime(n_layers, tokens_per_page)
        kvs = rt.prefill_pages(bench_pages(max(pages), tokens_per_page))
        for p in pages:
            for q in questions:
                work = make_workload(rt.vlm, p, q)
                inputs = [PageInput(lab, kv) for lab, kv in zip(work.labels, kvs[:p],
                                                                strict=True)]
                _scoring_peak(rt, inputs, work.prefix, work.question)  # warm-up
                peak, n = _scoring_peak(rt, inputs, work.prefix, work.question)
                rows.append({"layers": n_layers, "pages": p, "question_tokens": q,
                             "prompt_tokens": n, "scoring_peak_mb": peak})
                print(f"L={n_layers} pages={p} question={q} N={n}: scoring peak "
                      f"{peak:.1f} MB", flush=True)
        work = make_workload(rt.vlm, min(pages), min(questions))
        inputs = [PageInput(lab, kv) for lab, kv in zip(work.labels, kvs, strict=False)]
        ms = _decode_ms(rt, inputs, work.prefix, work.question, decode_tokens, repeats)
        decode.append({"layers": n_layers, "pages": min(pages), "new_tokens": decode_tokens,
                       "ms_per_token": ms})
        print(f"L={n_layers}: decode {ms:.2f} ms/token", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    doc = {"label": label, "commit": commit, "tokens_per_page": tokens_per_page,
           "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
                      "1 thread",
           "command": " ".join(["python -m lab.ttft.core_costs", *sys.argv[1:]]),
           "wall_seconds": time.perf_counter() - t0, "scoring": rows, "decode": decode}
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m lab.ttft.core_costs [--layers 8,32] [--out FILE]`."""
    p = argparse.ArgumentParser(prog="python -m lab.ttft.core_costs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", default="8,32")
    p.add_argument("--pages", default="4,16")
    p.add_argument("--questions", default="32,256")
    p.add_argument("--tokens-per-page", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    run_core_costs(layers=ints(a.layers), pages=ints(a.pages), questions=ints(a.questions),
                   tokens_per_page=a.tokens_per_page, decode_tokens=a.decode_tokens,
                   repeats=a.repeats, label=a.label, out=a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
