"""Decode rate, eager against captured: tokens a second for one stream and summed over 16.

    python -m lab.gpu.decode_rate [--device cuda] [--model-shape 7b] [--pages 8]
        [--tokens-per-page 256] [--new-tokens 64] [--modes off,on] --out DIR

The timing model (`lab.ttft.model`, random weights) answers over cached pages with full reuse
(the prefill is not what is measured); each answer then decodes `--new-tokens` tokens with no
stop token. For each decode mode ("off": eager `forward_step`; "on": the step captured as
CUDA graphs, or compiled on the CPU, `conduit_core.passes.step_graphs`) and each stream count
(1, 16): the wall time of the decode steps after the first (the device synchronised), tokens
a second summed over the streams. Writes decode_rate.json and decode_rate.md with the command.

Public API:
  main(argv=None) -> int
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.gpu.check_parts import request
from lab.ttft.model import bench_pages, build_bench_vlm, make_workload

STREAMS = [1, 16]


def _rate(rt: ReuseRuntime, kvs: list[Any], work: Any, streams: int, new: int,
          device: str) -> float:
    """Tokens a second summed over `streams` answers decoding together."""
    states = [answering.start_answer(rt,
        request(work.prefix, kvs, f"{work.question} {i}", "full_reuse",
                                      0.0, new)) for i in range(streams)]
    for s in states:
        s.decode.stops = frozenset()
    rt.step(states)  # admission into the pool
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0, before = time.perf_counter(), sum(s.decode.picked for s in states)
    while not all(s.done for s in states):
        rt.step(states)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    tokens = sum(s.decode.picked for s in states) - before
    for s in states:
        rt.release(s)
    return tokens / (time.perf_counter() - t0)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lab.gpu.decode_rate [options]`."""
    p = argparse.ArgumentParser(prog="python -m lab.gpu.decode_rate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--model-shape", default=None, help="default 7b on a GPU, tiny on the CPU")
    p.add_argument("--pages", type=int, default=8)
    p.add_argument("--tokens-per-page", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--modes", default="off,on",
                   help="decode modes (on compiles on the CPU: minutes on two cores)")
    p.add_argument("--out", type=Path, required=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    if not gpu:
        torch.set_num_threads(1)
    shape = args.model_shape or ("7b" if gpu else "tiny")
    vlm = build_bench_vlm(shape, tokens_per_page=args.tokens_per_page, device=args.device,
                          dtype=torch.bfloat16 if gpu else torch.float32)
    work = make_workload(vlm, args.pages, 32)
    images = bench_pages(args.pages, args.tokens_per_page)
    rows = []
    for mode in args.modes.split(","):
        rt = ReuseRuntime(vlm, never_above_full=False, decode_compile=mode,
                          decode_slots=max(STREAMS),
                          decode_positions=max(STREAMS) * 4096)
        t0 = time.perf_counter()
        line = rt.prepare_decode(300)
        prepare_s = time.perf_counter() - t0
        kvs = rt.prefill_pages(images)
        for streams in STREAMS:
            rate = _rate(rt, kvs, work, streams, args.new_tokens, args.device)
            rows.append({"mode": mode, "kind": rt.graphs.kind, "streams": streams,
                         "tokens_per_s": rate, "prepare_s": prepare_s, "prepare": line})
            print(f"{mode} ({rt.graphs.kind}) {streams} streams: {rate:.1f} tokens/s",
                  flush=True)
    command = "python -m lab.gpu.decode_rate " + " ".join(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "shape": shape, "device": args.device, "pages": args.pages,
           "tokens_per_page": args.tokens_per_page, "new_tokens": args.new_tokens,
           "rows": rows}
    (args.out / "decode_rate.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Decode rate ({shape}, {args.device})", "", f"`{command}`", "",
             "| mode | kind | streams | tokens/s | prepare s |",
             "| --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {r['mode']} | {r['kind']} | {r['streams']} | {r['tokens_per_s']:.1f} | "
              f"{r['prepare_s']:.1f} |" for r in rows]
    (args.out / "decode_rate.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
