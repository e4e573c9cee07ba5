"""Fidelity of every refresh policy against a full prefill, over synthetic multi-page requests.

For each request (pages prefilled once in their canonical page context, then reused under a
new system prefix with labels, `lab.fidelity.data`), the reference is a full prefill from
the images (vision tower included). Every policy at every budget is compared with it on:
  top1_agreement     first generated token equal to the reference's (fraction of samples)
  kl                 KL(reference || policy) of the first-token distributions (nats)
  continuation_match greedy continuation of `max_new_tokens` (16) tokens: length of the
                     common prefix with the reference's (a stop counts as a token) divided
                     by the reference's length; 1.0 = identical answer
  flops_ratio_lm     the answer's language-model prefill FLOPs over a full prefill's (the
                     headline: vision tower excluded on both sides)
  flops_ratio_total  the same with the vision tower counted (a full prefill runs it; reuse
                     of cached page embeddings does not)
  seconds            the answer's time to first token (scoring + refresh + first token)
Rows are averaged over samples. Outputs: JSON at `out`, a markdown table and a PNG plot with
the same stem.

Public API:
  run_fidelity_eval(*, model, pages=4, budgets=(0.05, 0.1, 0.2), policies="all", samples=8,
                    out, seed=0, cache_dir, max_new_tokens=16, max_image_tokens=None,
                    command=None) -> dict
  kl_divergence(ref_logits, logits) -> float; continuation_match(ref, got) -> float
Command line: `conduit-lab eval fidelity` (lab/cli.py).
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import POLICIES, choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.fidelity.data import FidelityCase, make_cases
from lab.fidelity.report import write_plot, write_table
from lab.refresh_probe import probe_full_prefill, probe_refresh

DEFAULT_BUDGETS = (0.05, 0.1, 0.2)


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(p_ref || p) in nats of two logit vectors (V,)."""
    ref = torch.log_softmax(ref_logits.double(), dim=-1)
    got = torch.log_softmax(logits.double(), dim=-1)
    return float((ref.exp() * (ref - got)).sum().clamp_min(0.0))


def _with_stop(result: AnswerResult) -> list[int]:
    return result.token_ids + ([-1] if result.stop_reason == "stop" else [])


def continuation_match(ref: AnswerResult, got: AnswerResult) -> float:
    """Common-prefix length of the two greedy outputs (a stop is a token) over the
    reference's length."""
    a, b = _with_stop(ref), _with_stop(got)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n / len(a) if a else 1.0


def _resolve(policies: Sequence[str] | str) -> list[str]:
    names = list(POLICIES) if policies == "all" else list(policies)
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {sorted(POLICIES)}")
    return names


def _evaluate_case(rt: ReuseRuntime, case: FidelityCase, names: list[str],
                   budgets: Sequence[float], max_new_tokens: int,
                   seed: int) -> tuple[list[dict[str, Any]], float]:
    """Metrics of every (policy, budget) on one request, and the reference's TTFT."""
    fresh = list(zip(case.labels, case.images, strict=True))
    ref_probe = probe_full_prefill(rt, case.prefix, fresh, case.question)
    ref = answering.answer_full_prefill(rt, case.prefix, fresh, case.question,
                                 max_new_tokens=max_new_tokens)
    kvs = rt.prefill_pages(case.images)
    pages = [PageInput(label, kv) for label, kv in zip(case.labels, kvs, strict=True)]
    out = []
    for name in names:
        for budget in budgets:
            req = AnswerRequest(prefix=case.prefix, pages=pages, question=case.question,
                                policy=choose_policy(name), budget=budget,
                                max_new_tokens=max_new_tokens,
                                seed=seed)
            probe = probe_refresh(rt, req)
            result = answering.answer(rt, req)
            if result.token_ids[:1] and int(probe.logits[-1].argmax()) != result.token_ids[0]:
                raise RuntimeError(f"{name}: probe and answer disagree on the first token")
            out.append({
                "policy": name, "budget": budget,
                "top1_agreement": float(probe.logits[-1].argmax() == ref_probe.logits[-1].argmax()),
                "kl": kl_divergence(ref_probe.logits[-1], probe.logits[-1]),
                "continuation_match": continuation_match(ref, result),
                "flops_ratio_lm": result.flops_ratio_lm,
                "flops_ratio_total": result.flops_ratio_total, "seconds": result.ttft_s,
                "refreshed": result.refreshed_visual_tokens, "visual": result.visual_tokens,
            })
    return out, ref.ttft_s


def _average(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["policy"], r["budget"])].append(r)
    keys = ["top1_agreement", "kl", "continuation_match", "flops_ratio_lm",
            "flops_ratio_total", "seconds",
            "refreshed", "visual"]
    return [{"policy": p, "budget": b,
             **{k: sum(r[k] for r in g) / len(g) for k in keys}}
            for (p, b), g in groups.items()]


def run_fidelity_eval(
    *,
    model: str,
    pages: int = 4,
    budgets: Sequence[float] = DEFAULT_BUDGETS,
    policies: Sequence[str] | str = "all",
    samples: int = 8,
    out: Path,
    seed: int = 0,
    cache_dir: Path,
    max_new_tokens: int = 16,
    max_image_tokens: int | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Evaluate `policies` at `budgets` on `samples` requests of `pages` pages each against
    full prefill (see the module docstring); write `out` (JSON), `.md` and `.png` beside it
    and return the JSON document. `command` is recorded in the table (default: this
    process's command line). Torch runs single-threaded here for stable timings."""
    if pages < 1 or samples < 1 or not budgets:
        raise ValueError("pages and samples must be >= 1 and budgets non-empty")
    if any(not 0.0 <= b <= 1.0 for b in budgets):
        raise ValueError(f"budgets must lie in [0, 1], got {list(budgets)}")
    names = _resolve(policies)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        # each policy's own path, also where it costs more than a full prefill
        rt = ReuseRuntime(load_vlm(model, cache_dir=Path(cache_dir),
                                   max_image_tokens=max_image_tokens), never_above_full=False)
        rows: list[dict[str, Any]] = []
        ref_ttft = []
        for case in make_cases(samples, pages, seed):
            case_rows, ttft = _evaluate_case(rt, case, names, budgets, max_new_tokens, seed)
            rows += case_rows
            ref_ttft.append(ttft)
    finally:
        torch.set_num_threads(threads)
    doc: dict[str, Any] = {
        "model": model, "pages": pages, "samples": samples, "seed": seed,
        "budgets": list(budgets), "policies": names, "max_new_tokens": max_new_tokens,
        "max_image_tokens": rt.adapter.max_image_tokens,
        "lm_shape": asdict(rt.reuse.flops.lm),
        "full_prefill_seconds": sum(ref_ttft) / len(ref_ttft),
        "wall_seconds": time.perf_counter() - t0,
        "command": command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
                   "CPU, 1 thread",
        "rows": _average(rows),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    write_table(doc, out.with_suffix(".md"))
    write_plot(doc, out.with_suffix(".png"))
    return doc


def out_path_summary(doc: dict[str, Any], out: Path) -> str:
    """One line saying what was written."""
    return (f"{len(doc['rows'])} rows in {doc['wall_seconds']:.1f}s -> {out}, "
            f"{Path(out).with_suffix('.md')}, {Path(out).with_suffix('.png')}")

