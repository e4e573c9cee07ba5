"""Time to first token and FLOPs of page-KV reuse against full prefill, side by side (issue 7).

Workload: a random-weight Qwen2.5-VL (`lab.ttft.model`, shape "cpu" by default, "7b" for
GPUs), P pages of T visual tokens (default 8 x 256) prefilled beforehand in their canonical
page context and stored in each tier (`lab.ttft.tiers`), then asked about under a NEW
prefix (system prompt + a label before each page) with a question of `question_tokens`
tokens. Methods, each timed to the first generated token:
  full_prefill                 images -> processor -> vision tower -> every token (no tier)
  full_prefill_cached_vision   page entries loaded from the tier; every token recomputed from
                               the cached vision features (policy `full_prefill`)
  full_reuse                   loaded KV re-rotated, only text tokens computed (budget 0)
  conduit                      scoring pass + refresh of 10% of the visual tokens
  conduit_head_off             the same with the prompt head and the page labels computed
                               every time (no head cache, no label cache; every other
                               method takes the head from the cache)
  conduit_labels_off           conduit with the page labels as text rows, computed in both
                               passes (no label cache; every other reuse method takes them
                               stale from it, `conduit_core.label_cache`, warmed in the
                               warm-up round; the refresh recomputes every cached
                               label, `label_refresh="always"`, the methods' default;
                               the service's is "read")
  conduit_labels_page          conduit with a cached label recomputed only with its whole
                               page (`label_refresh="page"`)
  conduit_labels_budget        conduit with every label recomputed inside the 10% budget
                               (`label_refresh="budget"`: fewer visual tokens)
  cacheblend                   CacheBlend at 15% (all tokens through layers 0..1, then 15%)
  default                      the product default (`DEFAULT_POLICY` with its own options), the
                               labels the question reads refreshed (the service's rule)
  focus                        `conduit_focus` the same way (its own depth 0.8): fewer
                               tokens where the question's attention is focused
Reuse methods include the KV load from the tier. After `warmup` unrecorded rounds, `repeats`
rounds run every (method, tier) cell once each, in an order rotated every round, so slow
phases of a noisy machine hit all methods alike. Reported per cell: median TTFT; speedup over
full prefill (ratio of medians, same run; also the ratio of the fastest runs, less exposed
to other processes) and over full prefill with cached vision features (the same tier's
`full_prefill_cached_vision`: the fair baseline for the language model's work); both
analytic FLOPs ratios, `flops_ratio_lm` (language model only, the headline) and
`flops_ratio_total` (vision tower included on both sides); bound fractions
`bound_fraction` = speedup x flops_ratio_total and `bound_fraction_lm` = speedup over cached
vision x flops_ratio_lm (1.0 = the time saved matches the FLOPs saved); the median tier load.
`pages_sweep` repeats full prefill and CONDUIT over several page counts (first tier) and
records TTFT, FLOPs and peak memory (CUDA: peak allocated; CPU: peak RSS above the RSS
before the request, Linux VmHWM reset through /proc/self/clear_refs), and the scoring pass's
own peak memory (`scoring_peak_mb`, CONDUIT rows).

Command line: `conduit-lab bench ttft` (options in `lab.ttft.args`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.loader import DTYPES
from conduit_core.page_kv import PageKV
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY, PolicyOptions
from conduit_core.prompt.layout import LabelRefresh
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.refresh_probe import probe_full_prefill, probe_refresh
from lab.ttft.model import SHAPES, Workload, bench_pages, build_bench_vlm, make_workload
from lab.ttft.report import write_outputs
from lab.ttft.tiers import TIER_NOTES, BenchTiers, sync

RESULTS = Path(__file__).parent / "results"
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}  # max |diff| / max |logit|


@dataclass(frozen=True)
class Method:
    """A timed method: `policy` None means full prefill from the images."""

    name: str
    policy: str | None
    budget: float
    head_cache: bool = True  # the prompt head from the runtime's head cache
    label_cache: bool = True  # page labels stale from the runtime's label cache
    label_refresh: LabelRefresh = "always"  # which cached labels a refresh recomputes
    score_layers: str | float | None = None  # the policy's scored layers (None: its own)


METHODS = (Method("full_prefill", None, 1.0),
           Method("full_prefill_cached_vision", "full_prefill", 1.0),
           Method("full_reuse", "full_reuse", 0.0),
           Method("conduit", "conduit", 0.10),
           Method("conduit_head_off", "conduit", 0.10, head_cache=False, label_cache=False),
           Method("conduit_labels_off", "conduit", 0.10, label_cache=False),
           Method("conduit_labels_page", "conduit", 0.10, label_refresh="page"),
           Method("conduit_labels_budget", "conduit", 0.10, label_refresh="budget"),
           Method("cacheblend", "cacheblend", 0.15),
           Method("default", DEFAULT_POLICY, 0.10, label_refresh="read"),
           Method("focus", "conduit_focus", 0.10, label_refresh="read"))
_BY_NAME = {m.name: m for m in METHODS}


@dataclass
class Sample:
    """One timed request."""

    ttft_s: float
    load_s: float
    flops_ratio_lm: float
    flops_ratio_total: float
    flops_used: float
    flops_full: float
    refreshed: int
    peak_bytes: int | None = None


def _malloc_trim() -> None:
    """Return freed heap memory to the OS (glibc), so RSS growth shows new allocations."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


class BudgetCheckError(RuntimeError):
    """The correctness check failed: budget 1.0 did not reproduce full prefill."""


class PeakMemory:
    """Peak memory of a block: CUDA peak allocated, or CPU peak RSS above the RSS at the
    start (after returning freed heap memory to the OS, so reused heap pages count)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak: int | None = None
        self._base = 0

    @staticmethod
    def _status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"{field} not in /proc/self/status")

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            _malloc_trim()
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self._base = self._status("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self.peak = self._status("VmHWM") - self._base


def _variant(m: Method) -> tuple[bool, bool, LabelRefresh]:
    """The runtime options a method needs (the key of `_Runner.variants`)."""
    return m.head_cache, m.label_cache, m.label_refresh


class _Runner:
    """Runs one method on one tier for a fixed request."""

    def __init__(self, rt: ReuseRuntime, work: Workload, images: list[Image.Image],
                 tiers: BenchTiers, keys: Sequence[Any]) -> None:
        self.rt, self.work, self.images, self.tiers, self.keys = rt, work, images, tiers, keys
        self.variants = {_variant(m): ReuseRuntime(
            rt.vlm, head_cache=m.head_cache, label_cache=m.label_cache,
            label_refresh=m.label_refresh, never_above_full=rt.never_above_full)
            for m in METHODS if _variant(m) != (rt.reuse.heads is not None,
                                                rt.reuse.labels is not None,
                                                rt.reuse.label_refresh)}

    def once(self, method: Method, tier: str, *, memory: bool = False) -> Sample:
        rt, w = self.rt, self.work
        sync(rt.adapter.device)
        peak = PeakMemory(rt.adapter.device)
        measured: contextlib.AbstractContextManager[Any] = (
            peak if memory else contextlib.nullcontext())
        if method.policy is None:
            with measured:
                res = answering.answer_full_prefill(rt, w.prefix, list(zip(w.labels, self.images,
                                                                strict=True)),
                                             w.question, max_new_tokens=1)
            load_s = 0.0
        else:
            with measured:
                kvs, load_s = self.tiers.load(tier, self.keys)
                pages = [PageInput(label, kv) for label, kv in zip(w.labels, kvs, strict=True)]
                runtime = self.variants.get(_variant(method), rt)
                policy = choose_policy(method.policy,
                                       PolicyOptions(score_layers=method.score_layers))
                res = answering.answer(runtime, AnswerRequest(w.prefix, pages, w.question,
                                                              policy=policy,
                                                              budget=method.budget,
                                                              max_new_tokens=1))
        return Sample(ttft_s=load_s + res.ttft_s, load_s=load_s,
                      flops_ratio_lm=res.flops_ratio_lm, flops_ratio_total=res.flops_ratio_total,
                      flops_used=res.flops_used, flops_full=res.flops_full,
                      refreshed=res.refreshed_visual_tokens, peak_bytes=peak.peak)


def _rounds(runner: _Runner, cells: list[tuple[Method, str]], repeats: int, warmup: int,
            memory: bool = False) -> dict[tuple[str, str], list[Sample]]:
    """Warm-up, then `repeats` timed rounds over all cells in a rotated order; with
    `memory`, one more round measures each cell's peak memory (its timing is not kept)."""
    for _ in range(warmup):
        for method, tier in cells:
            runner.once(method, tier)
    samples: dict[tuple[str, str], list[Sample]] = {(m.name, t): [] for m, t in cells}
    for rep in range(repeats):
        shift = rep % len(cells)
        for method, tier in cells[shift:] + cells[:shift]:
            samples[(method.name, tier)].append(runner.once(method, tier))
    if memory:
        for method, tier in cells:
            peak = runner.once(method, tier, memory=True).peak_bytes
            for sample in samples[(method.name, tier)]:
                sample.peak_bytes = peak
    return samples


def _rows(samples: dict[tuple[str, str], list[Sample]]) -> list[dict[str, Any]]:
    full = statistics.median(s.ttft_s for s in samples[("full_prefill", "none")])
    full_min = min(s.ttft_s for s in samples[("full_prefill", "none")])
    cached = {tier: statistics.median(s.ttft_s for s in got)
              for (name, tier), got in samples.items() if name == "full_prefill_cached_vision"}
    rows = []
    for (name, tier), got in samples.items():
        ttft = statistics.median(s.ttft_s for s in got)
        load = statistics.median(s.load_s for s in got)
        speedup = full / ttft
        base = cached.get(tier, next(iter(cached.values()), None))  # full_prefill: 1st tier
        speedup_cv = base / ttft if base is not None else None
        lm, total = got[0].flops_ratio_lm, got[0].flops_ratio_total
        peaks = [s.peak_bytes for s in got if s.peak_bytes is not None]
        rows.append({
            "method": name, "tier": tier, "ttft_ms_median": 1e3 * ttft, "speedup": speedup,
            "speedup_vs_cached_vision": speedup_cv,
            "flops_ratio_lm": lm, "flops_ratio_total": total,
            "bound_fraction": speedup * total,
            "bound_fraction_lm": speedup_cv * lm if speedup_cv is not None else None,
            "load_ms_median": 1e3 * load, "load_fraction": load / ttft,
            "ttft_ms_min": 1e3 * min(s.ttft_s for s in got),
            "ttft_ms_max": 1e3 * max(s.ttft_s for s in got),
            "speedup_of_min": full_min / min(s.ttft_s for s in got),
            "refreshed_visual_tokens": got[0].refreshed, "gflops_used": got[0].flops_used / 1e9,
            "gflops_full": got[0].flops_full / 1e9, "samples": len(got),
            "peak_mb": max(peaks) / 2**20 if peaks else None,
        })
    return rows


@torch.no_grad()
def check_budget_one(rt: ReuseRuntime, work: Workload, images: list[Image.Image],
                     kvs: list[PageKV]) -> dict[str, Any]:
    """First-token logits of CONDUIT at budget 1.0 (from cached pages) against full prefill
    from the images: max |diff| over max |logit| within the dtype's tolerance, same top-1."""
    fresh = list(zip(work.labels, images, strict=True))
    ref = probe_full_prefill(rt, work.prefix, fresh, work.question).logits[-1]  # (V,)
    pages = [PageInput(label, kv) for label, kv in zip(work.labels, kvs, strict=True)]
    got = probe_refresh(rt, AnswerRequest(work.prefix, pages, work.question,
                                          policy=choose_policy("conduit"),
                                          budget=1.0, max_new_tokens=1)).logits[-1]  # (V,)
    dtype = str(rt.adapter.dtype).removeprefix("torch.")
    rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
    top1 = bool(got.argmax() == ref.argmax())
    ok = top1 and rel <= TOLERANCE.get(dtype, 1e-4) and bool(torch.isfinite(got).all())
    return {"budget_one_rel_diff": rel, "top1_equal": top1, "tolerance": TOLERANCE.get(dtype),
            "passed": ok}


def _sweep(rt: ReuseRuntime, tiers: BenchTiers, pages_sweep: Sequence[int], tokens: int,
           question_tokens: int, repeats: int, warmup: int) -> list[dict[str, Any]]:
    """Full prefill and CONDUIT at each page count (first tier), with peak memory."""
    images = bench_pages(max(pages_sweep), tokens)
    kvs = rt.prefill_pages(images)
    tier = tiers.names[0]
    cells = [(_BY_NAME["full_prefill"], "none"), (_BY_NAME["conduit"], tier)]
    out = []
    for p in pages_sweep:
        keys = tiers.put(kvs[:p], tag=f"sweep-{p}", only=tier)
        runner = _Runner(rt, make_workload(rt.vlm, p, question_tokens), images[:p], tiers, keys)
        scoring_mb = _scoring_peak_mb(rt, runner.work, kvs[:p])
        for row in _rows(_rounds(runner, cells, repeats, warmup, memory=True)):
            out.append({"pages": p, **{k: row[k] for k in (
                "method", "tier", "ttft_ms_median", "speedup", "flops_ratio_lm",
                "flops_ratio_total", "gflops_used", "gflops_full", "peak_mb",
                "load_ms_median")}, "scoring_peak_mb": scoring_mb
                if row["method"] == "conduit" else None})
    return out


@torch.no_grad()
def _scoring_peak_mb(rt: ReuseRuntime, work: Workload, kvs: list[PageKV]) -> float | None:
    """Peak memory of the scoring pass alone over an assembled request (MB)."""
    asm = rt.reuse.assemble(work.prefix, [PageInput(label, kv) for label, kv in
                                    zip(work.labels, kvs, strict=True)], work.question)
    peak = PeakMemory(rt.adapter.device)
    with peak:
        rt.reuse.scoring(asm)
    return None if peak.peak is None else peak.peak / 2**20


def run_ttft_bench(*, model_shape: str = "cpu", pages: int = 8, tokens_per_page: int = 256,
                   question_tokens: int = 32, tiers: Sequence[str] = ("memory", "disk", "redis"),
                   repeats: int = 5, warmup: int = 1, pages_sweep: list[int] | None = None,
                   out: Path | None = None, device: str = "cpu",
                   dtype: str | torch.dtype = "float32", threads: int | None = 1,
                   sweep_repeats: int | None = None, check: bool = True,
                   command: str | None = None, workdir: Path | None = None) -> dict[str, Any]:
    """Run the benchmark described in the module docstring; write JSON (`out`, default
    `lab/ttft/results/ttft_<shape>.json`), a markdown table and, with a sweep, a PNG beside it.
    `threads` pins torch's CPU threads for the run (None leaves them)."""
    if pages < 1 or tokens_per_page < 1 or question_tokens < 1 or repeats < 1 or warmup < 0:
        raise ValueError("pages, tokens_per_page, question_tokens, repeats must be >= 1")
    if not tiers:
        raise ValueError("at least one tier is needed")
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    dtype_name = str(dt).removeprefix("torch.")
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    t_start = time.perf_counter()
    try:
        vlm = build_bench_vlm(model_shape, tokens_per_page=tokens_per_page, device=device,
                              dtype=dt)
        rt = ReuseRuntime(vlm, label_refresh="always")  # the methods' default (`Method`)
        work = make_workload(vlm, pages, question_tokens)
        images = bench_pages(pages, tokens_per_page)
        kvs = rt.prefill_pages(images)
        checks = check_budget_one(rt, work, images, kvs) if check else None
        if checks is not None and not checks["passed"]:
            raise BudgetCheckError(f"budget 1.0 does not reproduce full prefill: {checks}")
        with tempfile.TemporaryDirectory(prefix="ttft-", dir=workdir) as tmp, \
                BenchTiers(tiers, Path(tmp)) as bt:
            keys = bt.put(kvs, tag="main")
            runner = _Runner(rt, work, images, bt, keys)
            cells = [(_BY_NAME["full_prefill"], "none")] + [
                (m, t) for t in tiers for m in METHODS if m.policy is not None]
            rows = _rows(_rounds(runner, cells, repeats, warmup))
            sweep = (_sweep(rt, bt, pages_sweep, tokens_per_page, question_tokens,
                            sweep_repeats or repeats, warmup) if pages_sweep else None)
    finally:
        torch.set_num_threads(saved_threads)
    probe = rt.reuse.assemble(work.prefix, [PageInput(lab, kv) for lab, kv in
                                      zip(work.labels, kvs, strict=True)], work.question)
    n_v = int(probe.layout.visual_rows().numel())
    doc: dict[str, Any] = {
        "workload": {
            "model_shape": model_shape, "model_notes": SHAPES[model_shape].notes,
            "lm_shape": asdict(rt.reuse.flops.lm), "vision": dict(SHAPES[model_shape].vision),
            "pages": pages, "tokens_per_page": tokens_per_page,
            "question_tokens": question_tokens, "prompt_tokens": probe.layout.n,
            "visual_tokens": n_v, "text_tokens": probe.layout.n - n_v,
            "budgets": {m.name: m.budget for m in METHODS if m.policy is not None},
            "tiers": list(tiers), "tier_notes": {t: TIER_NOTES[t] for t in tiers},
            "tier_bytes_per_page": bt.bytes_per_page,
            "repeats": repeats, "warmup": warmup, "device": device, "dtype": dtype_name,
            "threads": threads, "check": checks,
            "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}",
            "command": command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "wall_seconds": time.perf_counter() - t_start,
        },
        "rows": rows,
    }
    if sweep is not None:
        doc["sweep"] = sweep
    out = Path(out) if out is not None else RESULTS / f"ttft_{model_shape}.json"
    write_outputs(doc, out)
    return doc


def run_from_args(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Run with parsed options; a list in `--pages` is a sweep (the largest count is also
    the main workload unless `--sweep` is given)."""
    counts = [int(x) for x in str(args.pages).split(",") if x.strip()]
    sweep = [int(x) for x in args.sweep.split(",")] if args.sweep else None
    if len(counts) > 1 and sweep is None:
        sweep = counts
    pages = 8 if len(counts) > 1 and 8 in counts else counts[-1]
    doc = run_ttft_bench(
        model_shape=args.model_shape, pages=pages, tokens_per_page=args.tokens_per_page,
        question_tokens=args.question_tokens, tiers=args.tier.split(","),
        repeats=args.repeats, warmup=args.warmup, pages_sweep=sweep,
        sweep_repeats=args.sweep_repeats, out=args.out, device=args.device, dtype=args.dtype,
        threads=args.threads, check=not args.no_check, command=command)
    from lab.ttft.report import summary_lines

    print("\n".join(summary_lines(doc)))
    return doc

