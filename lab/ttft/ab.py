"""A/B of the runtime's TTFT optimisations on the TTFT benchmark's workload, side by side.

CONDUIT at 10% over pages held in memory, in four variants, with full prefill (vision tower
included) as the yardstick, all alternating in rotated order after a warm-up round:
  optimised         as shipped
  no_blocked_attn   `layer_forward.BLOCKED_ATTENTION = False`: masked subsets take one sdpa
                    call with an (R, N) mask and K/V repeated per query head
  no_stale_reuse    the refresh recomputes every text row (the scoring pass's rows dropped
                    by the runtime's observer, `PhaseClock`, right after the pass)
  neither           both off (the runtime before these two optimisations)
(The per-page load that issue 31's staged, batched one replaced has left the product, and
with it its variant here.)
Reported: median TTFT, speedup over full prefill, both FLOPs ratios (`flops_ratio_lm`, the
language model only; `flops_ratio_total`, vision included), speedup / bound (total), and the
median time of each prefill phase the runtime's observer sees (`phase_ms`: page load, scoring
pass, refresh, first-token logits; on the CPU, where every operation runs as it is issued).

Public API:
  VARIANTS
  PhaseClock(drop_stale=False)   a `PassObserver` timing the runtime's phases (`.seconds`)
  run_ab(*, model_shape="cpu", pages=8, tokens_per_page=256, question_tokens=32, repeats=5,
         warmup=1, threads=1, out=None) -> dict
  main(argv=None) -> int          `python -m lab.ttft.ab --help`
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.pass_observer import Phase
from conduit_core.passes import layer_forward
from conduit_core.passes.assembly import Assembly
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.model import bench_pages, build_bench_vlm, make_workload

VARIANTS = {"optimised": (True, True), "no_blocked_attn": (False, True),
            "no_stale_reuse": (True, False), "neither": (False, False)}  # (blocked, stale reuse)


class PhaseClock:
    """A `PassObserver` that sums the wall time of each phase it sees into `.seconds` (by
    phase name); with `drop_stale`, it drops the scoring pass's rows once the pass is done,
    so that the refresh recomputes every text row (the runtime before stale reuse)."""

    def __init__(self, drop_stale: bool = False) -> None:
        self.drop_stale = drop_stale
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: Phase, assembly: Assembly) -> Iterator[None]:
        """Time phase `name`; after a scoring pass, drop its rows where asked."""
        start = time.perf_counter()
        yield
        self.seconds[name] += time.perf_counter() - start
        if self.drop_stale and name == "scoring":
            assembly.stale = None



def run_ab(*, model_shape: str = "cpu", pages: int = 8, tokens_per_page: int = 256,
           question_tokens: int = 32, repeats: int = 5, warmup: int = 1, threads: int = 1,
           out: Path | None = None) -> dict[str, Any]:
    """Time the variants (module docstring); return and optionally write the JSON."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        vlm = build_bench_vlm(model_shape, tokens_per_page=tokens_per_page)
        # each variant's own path, also where it costs more than a full prefill (tiny pages)
        runtime = ReuseRuntime(vlm, never_above_full=False)
        work = make_workload(vlm, pages, question_tokens)
        images = bench_pages(pages, tokens_per_page)
        kvs = runtime.prefill_pages(images)
        request = AnswerRequest(work.prefix, [PageInput(lab, kv) for lab, kv in
                                              zip(work.labels, kvs, strict=True)],
                                work.question,
                                policy=choose_policy("conduit"), budget=0.1, max_new_tokens=1)
        answering.warm_labels(runtime, request.prefix, request.pages)  # once, with the pages
        fresh = list(zip(work.labels, images, strict=True))
        names = ["full_prefill", *VARIANTS]
        times: dict[str, list[float]] = {n: [] for n in names}
        phases: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        ratios: dict[str, tuple[float, float]] = {"full_prefill": (1.0, 1.0)}
        for rep in range(warmup + repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                blocked, reuse = VARIANTS.get(name, (True, True))
                clock = PhaseClock(drop_stale=not reuse)
                with answering.observing(runtime, clock):
                    if name == "full_prefill":
                        res = answering.answer_full_prefill(
                            runtime, work.prefix, fresh, work.question, max_new_tokens=1)
                    else:
                        with layer_forward.blocked_rows(blocked):
                            res = answering.answer(runtime, request)
                        ratios[name] = (res.flops_ratio_lm, res.flops_ratio_total)
                if rep >= warmup:
                    times[name].append(res.ttft_s)
                    phases[name].append(clock.seconds)
    finally:
        torch.set_num_threads(saved)
    full = statistics.median(times["full_prefill"])
    rows = []
    for name in names:
        med = statistics.median(times[name])
        rows.append({"variant": name, "ttft_ms_median": 1e3 * med, "speedup": full / med,
                     "flops_ratio_lm": ratios[name][0], "flops_ratio_total": ratios[name][1],
                     "bound_fraction": full / med * ratios[name][1],
                     "phase_ms": {p: 1e3 * statistics.median(c.get(p, 0.0) for c in phases[name])
                                  for p in sorted(set().union(*phases[name]))},
                     "ttft_ms_all": [1e3 * t for t in times[name]]})
    doc = {"workload": {"model_shape": model_shape, "pages": pages,
                        "tokens_per_page": tokens_per_page, "question_tokens": question_tokens,
                        "repeats": repeats, "warmup": warmup, "threads": threads},
           "rows": rows}
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m lab.ttft.ab [--repeats 5] [--out FILE]`."""
    p = argparse.ArgumentParser(prog="python -m lab.ttft.ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-shape", default="cpu")
    p.add_argument("--pages", type=int, default=8)
    p.add_argument("--tokens-per-page", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    doc = run_ab(model_shape=args.model_shape, pages=args.pages,
                 tokens_per_page=args.tokens_per_page, repeats=args.repeats,
                 warmup=args.warmup, out=args.out)
    for r in doc["rows"]:
        print(f"{r['variant']:16s} {r['ttft_ms_median']:9.1f} ms  {r['speedup']:5.2f}x  "
              f"FLOPs LM {r['flops_ratio_lm']:.3f} total {r['flops_ratio_total']:.3f}  "
              f"speedup/bound {r['bound_fraction']:.2f}  phases ms "
              + " ".join(f"{p} {ms:.1f}" for p, ms in r["phase_ms"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
