"""A/B of two source trees on the TTFT benchmark's CPU workload, in one invocation.

Each round runs a fresh process per tree (`PYTHONPATH` = the tree; one thread), in an order
that alternates every round, so slow phases of a shared machine hit both alike. A process
builds the "cpu" shape model (`lab.ttft.model`: the same in both trees), prefills the
pages, warms the head and labels, and times the prefill half of each method over pages held
in memory (`lab.answering.answer` with one new token: assembly, scoring pass, refresh,
first-token logits), `per_process` times each after one warm-up. Reported per tree and
method: the median over all rounds and runs, and B over A.

Public API:
  METHODS                      (name, policy, budget)
  run_ab_trees(a, b, *, rounds=3, per_process=3, pages=8, out) -> dict
  main(argv=None) -> int       `python -m lab.ttft.ab_trees A_TREE B_TREE --out FILE`
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METHODS = (("full_prefill_cached_vision", "full_prefill", 1.0), ("full_reuse", "full_reuse", 0.0),
           ("conduit", "conduit", 0.1), ("conduit_per_page", "conduit_per_page", 0.1))

_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab.ttft.model import bench_pages, build_bench_vlm, make_workload
try:
    from lab.answering import answer, warm_labels
except ImportError:  # a tree from before the runtime's surface was the product's
    answer, warm_labels = ReuseRuntime.answer, ReuseRuntime.warm_labels
methods, pages, runs = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
vlm = build_bench_vlm("cpu", tokens_per_page=256)
rt = ReuseRuntime(vlm)
work = make_workload(vlm, pages, 32)
kvs = rt.prefill_pages(bench_pages(pages, 256))
inputs = [PageInput(label, kv) for label, kv in zip(work.labels, kvs)]
warm_labels(rt, work.prefix, inputs)
out = {}
for name, policy, budget in methods:
    req = AnswerRequest(work.prefix, inputs, work.question,
                        policy=choose_policy(policy), budget=budget,
                        max_new_tokens=1)
    answer(rt, req)
    out[name] = [1e3 * answer(rt, req).ttft_s for _ in range(runs)]
print(json.dumps(out))
"""


def _child(tree: Path, pages: int, runs: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(METHODS), str(pages),
                           str(runs)], cwd=tree, env=env, capture_output=True, text=True,
                          check=True)
    result: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_ab_trees(a: Path, b: Path, *, rounds: int = 3, per_process: int = 3, pages: int = 8,
                 out: Path, command: str = "") -> dict[str, Any]:
    """Time both trees (module docstring); write JSON at `out` and markdown beside it."""
    times: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    for r in range(rounds):
        for side in (("a", "b") if r % 2 == 0 else ("b", "a")):
            got = _child(a if side == "a" else b, pages, per_process)
            for name, ms in got.items():
                times[side].setdefault(name, []).extend(ms)
    rows = []
    for name, _, _ in METHODS:
        ma, mb = statistics.median(times["a"][name]), statistics.median(times["b"][name])
        rows.append({"method": name, "a_ms_median": ma, "b_ms_median": mb, "b_over_a": mb / ma,
                     "a_ms_all": times["a"][name], "b_ms_all": times["b"][name]})
    doc = {"workload": {"model_shape": "cpu", "pages": pages, "tokens_per_page": 256,
                        "question_tokens": 32, "tier": "memory (pages in the process)",
                        "rounds": rounds, "per_process": per_process, "threads": 1,
                        "a": str(a), "b": str(b), "command": command},
           "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# A/B of two trees on the TTFT CPU workload ({pages} pages x 256 tokens)", "",
             f"Command: `{command}`. A = `{a}`, B = `{b}`; {rounds} alternating rounds x "
             f"{per_process} runs a method, one thread, medians (ms).", "",
             "| method | A ms | B ms | B / A |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r['method']} | {r['a_ms_median']:.1f} | {r['b_ms_median']:.1f} | "
              f"{r['b_over_a']:.3f} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m lab.ttft.ab_trees", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-process", type=int, default=3)
    p.add_argument("--pages", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "-m", "lab.ttft.ab_trees",
                          *(sys.argv[1:] if argv is None else argv)])
    doc = run_ab_trees(args.a, args.b, rounds=args.rounds, per_process=args.per_process,
                       pages=args.pages, out=args.out, command=command)
    for r in doc["rows"]:
        print(f"{r['method']:28s} A {r['a_ms_median']:8.1f}  B {r['b_ms_median']:8.1f}  "
              f"B/A {r['b_over_a']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
