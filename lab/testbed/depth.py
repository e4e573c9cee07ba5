"""A shorter scoring pass (issues 65 and 67): CONDUIT's rules scoring only the first layers.

A scoring pass stops after its last scored layer (`conduit_core.passes.stale_pass`), so
scoring the first ceil(f * L) layers (`ScoreConfig.layers` as a depth f) costs that share
of the pass's layers, and its launching operations with it. Two measurements:

  * answers: the depth candidates (`depth_candidates`: the default `conduit_per_page`, and the
    cheaper-count rules `cv_page_knee` and `conduit_adaptive`, at depths 0.6 and 0.8; the
    default at 0.4 too, and at 1.0, every layer, as it was before its depth became 0.6:
    `cv_depth_10`; `cv_depth_06` is now the default itself)
    registered beside `lab.testbed.variants`' own and probed by it (the same arguments);
  * launching ops a layer of the prefill half, on the accelerator's path in bf16 on the
    narrow 28-layer model, as `tests/core/test_op_counts.py` counts them
    (`lab.ttft.op_count`), for `conduit_per_page` at each depth against full prefill, at
    2 / 8 / 32 pages.

    python -m lab.testbed.depth variants --weights W --seed 28 --budgets 0.1 --n 300 \
        --policies conduit_per_page --candidates cv_depth_08,cv_depth_06 --out FILE
    python -m lab.testbed.depth ops --out lab/testbed/results/depth_ops.json
    python -m lab.testbed.depth flops --weights W --seed 28 --n 20 --out FILE

`flops` splits an answer's LM FLOPs (as shares of full prefill's) into the scoring pass and
the refresh at each depth, for `conduit_per_page` at 10% on the testbed's probe questions.

Results: `lab/testbed/NOTES.md` ("A shorter scoring pass").
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from conduit_core.policies import choose_policy, get_policy
from conduit_core.policies.choice import PolicyChoice, PolicyOptions
from conduit_core.policies.conduit import ConduitPolicy
from lab import answering
from lab.testbed.cheaper import CHEAPER


def _at(policy: object, depth: float) -> ConduitPolicy:
    assert isinstance(policy, ConduitPolicy)
    return policy.with_options(PolicyOptions(score_layers=depth))


def depth_candidates() -> dict[str, ConduitPolicy]:
    """The depth candidates by name (module docstring); the lab's ablations registered."""
    import lab.ablations  # noqa: F401 (registers `conduit_adaptive`)
    bases = {"depth": get_policy("conduit_per_page"), "page_knee": CHEAPER["cv_page_knee"],
             "adaptive": get_policy("conduit_adaptive")}
    depths = {"depth": (1.0, 0.8, 0.6, 0.4), "page_knee": (0.8, 0.6), "adaptive": (0.8, 0.6)}
    return {f"cv_{name}_{round(depth * 10):02d}": _at(base, depth)
            for name, base in bases.items() for depth in depths[name]}


def _count(runtime: Any, kvs: list[Any], choice: PolicyChoice) -> tuple[float, float]:
    """Ops a layer of the prefill half and of its passes alone, as `count_prefill` counts
    them (head and labels warm, the second run counted, on the accelerator's path)."""
    from lab.ttft.op_count import (
        NARROW_LAYERS,
        PhaseCounting,
        accelerator_path,
        answer_request,
        prefill_ops,
    )
    request = replace(answer_request(runtime.vlm, kvs, "conduit_per_page"), policy=choice)
    answering.warm_labels(runtime, request.prefix, request.pages)
    phases = PhaseCounting()
    with answering.observing(runtime, phases), accelerator_path():
        prefill_ops(runtime, request)
        phases.reset()
        ops = prefill_ops(runtime, request)
    return ops.total / NARROW_LAYERS, phases.passes.total / NARROW_LAYERS


def depth_ops(pages: tuple[int, ...] = (2, 8, 32),
              depths: tuple[float, ...] = (1.0, 0.8, 0.6)) -> list[dict[str, Any]]:
    """Per page count and depth: `conduit_per_page`'s ops a layer (whole prefill half and
    passes alone) in bf16 and their ratio to full prefill's."""
    from lab.ttft.op_count import narrow_runtime
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt, kvs = narrow_runtime(max(pages), dtype=torch.bfloat16)
        rows = []
        for n in pages:
            full = _count(rt, kvs[:n], choose_policy("full_prefill"))
            for depth in depths:
                whole, passes = _count(rt, kvs[:n], choose_policy(
                    "conduit_per_page", PolicyOptions(score_layers=depth)))
                rows.append({"pages": n, "depth": depth, "whole": round(whole, 2),
                             "passes": round(passes, 2), "full_whole": round(full[0], 2),
                             "full_passes": round(full[1], 2),
                             "ratio_whole": round(whole / full[0], 3),
                             "ratio_passes": round(passes / full[1], 3)})
        return rows
    finally:
        torch.set_num_threads(saved)


def depth_flops(weights: Path, seed: int, n: int,
                depths: tuple[float, ...] = (1.0, 0.8, 0.6)) -> list[dict[str, Any]]:
    """Per probe question (distractors) and depth: the charged scoring pass and refresh of
    `conduit_per_page` at 10% as shares of a full prefill's LM FLOPs, and the rows they ran."""
    from conduit_core.answer_types import PageInput
    from conduit_core.runtime import ReuseRuntime
    from lab.testbed.batches import page_image
    from lab.testbed.probe import load_checkpoint_vlm, probe_samples
    from worker.prompt import ANSWER_PREFIX, page_label
    rt = ReuseRuntime(load_checkpoint_vlm(weights), never_above_full=False)
    policy = get_policy("conduit_per_page")
    rows = []
    for i, s in enumerate(probe_samples(n, seed, "distractors")):
        kvs = rt.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        inputs = [PageInput(page_label(s.doc_name, p + 1), kv)
                  for p, kv in zip(s.pages, kvs, strict=True)]
        answering.warm_labels(rt, ANSWER_PREFIX, inputs)
        for depth in depths:
            asm = rt.reuse.assemble(ANSWER_PREFIX, inputs, s.text, last_only=True)
            full = rt.reuse.costs.refresh(asm.layout, torch.arange(asm.layout.n), True)
            choice = _at(policy, depth)
            ctx = rt.reuse.policy_context(asm, 0.1)
            chosen = choice(ctx)
            _, computed = rt.reuse.refresh(asm, chosen)
            rows.append({"question": i, "depth": depth,
                         "text_rows": int(asm.fresh_text_rows().numel()),
                         "refresh_rows": int(computed.numel()),
                         "scoring": ctx.extra_flops / full,
                         "refresh": rt.reuse.refresh_flops(asm, computed) / full})
    return rows


def _flops_markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# Where a shorter scoring pass's LM FLOPs go (testbed, conduit_per_page at 10%)",
             "", "Produced by:", "", "```", command, "```", "",
             "Means over the probe questions; shares of a full prefill's LM FLOPs.", "",
             "| depth | questions | text rows | refresh rows | scoring pass | refresh | sum |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for depth in sorted({r["depth"] for r in rows}, reverse=True):
        at = [r for r in rows if r["depth"] == depth]
        mean = {k: sum(r[k] for r in at) / len(at)
                for k in ("text_rows", "refresh_rows", "scoring", "refresh")}
        lines.append(f"| {depth} | {len(at)} | {mean['text_rows']:.1f} | "
                     f"{mean['refresh_rows']:.1f} | {mean['scoring']:.4f} | "
                     f"{mean['refresh']:.4f} | {mean['scoring'] + mean['refresh']:.4f} |")
    return "\n".join(lines) + "\n"


def _ops_markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# Launching ops a layer of a shorter scoring pass (bf16, accelerator path)", "",
             "Produced by:", "", "```", command, "```", "",
             "`conduit_per_page` at 10% scoring the first ceil(depth * 28) layers of the narrow "
             "28-layer model, against full prefill from cached pages; ops a layer as "
             "`tests/core/test_op_counts.py` counts them.", "",
             "| pages | depth | whole | full prefill | ratio | passes | full prefill | ratio |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['pages']} | {r['depth']} | {r['whole']} | {r['full_whole']} | "
              f"{r['ratio_whole']} | {r['passes']} | {r['full_passes']} | "
              f"{r['ratio_passes']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    """`variants ...`: `lab.testbed.variants` with the depth candidates; `ops --out F`:
    the op counts (module docstring)."""
    if len(sys.argv) > 1 and sys.argv[1] == "variants":
        from lab.testbed import variants
        variants.CANDIDATES.update(depth_candidates())
        sys.argv = [sys.argv[0], *sys.argv[2:]]
        variants.main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["ops", "flops"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--weights", type=Path, help="flops: the testbed checkpoint")
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    command = "python -m lab.testbed.depth " + shlex.join(sys.argv[1:])
    if args.what == "flops":
        if args.weights is None:
            ap.error("flops needs --weights")
        torch.set_num_threads(1)
        rows = depth_flops(args.weights, args.seed, args.n)
        markdown = _flops_markdown(rows, command)
    else:
        rows = depth_ops()
        markdown = _ops_markdown(rows, command)
    args.out.write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
