"""What a newcomer meets: the default builtin model answering a 3-page question, timed.

`python -m lab.ttft.default_model` loads `builtin:small-qwen2-vl` (the service's default),
prefills three A4 text pages at the service's 100 dpi (about 500 visual tokens each), and
answers one question with a 64-token answer over them, side by side in rotated rounds:
  default                      the service's default at 10% over the cached page KV
                               (`DEFAULT_POLICY` with its own options, the runtime's label rule)
  focus                        `conduit_focus` the same way (its own depth 0.8, the labels
                               the question reads): fewer tokens where attention is focused
  full_reuse                   cached page KV, nothing refreshed
  full_prefill_cached_vision   every row recomputed from the cached page embeddings
  full_prefill                 vision tower and every row (no reuse at all)
Per method: median TTFT, decode tokens per second over the rest of the answer, LM FLOPs
ratio, whether the cost model fell back (a fallback runs a full prefill from the cached page
embeddings instead; `predicted` and `fallback_at` give the policy's predicted LM FLOPs and
that full prefill's, as ratios of a full prefill's); and `default_same_as_focus`: whether
`default` and `focus` gave the same refresh count, LM FLOPs and answer tokens in every round
(on these random weights `conduit_focus`'s cap binds: it refreshes `conduit_per_page`'s
tokens). One torch thread
(`torch.set_num_threads(1)`); medians of `--repeats` rounds after one warm-up. Writes JSON and
markdown (default lab/ttft/results/default_model.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw

from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY
from conduit_core.runtime import ReuseRuntime
from lab import answering
from worker.prompt import ANSWER_PREFIX, page_label

MODEL = "builtin:small-qwen2-vl"
QUESTION = "What is the total amount due on the invoice, and who signed the contract?"
METHODS = ("default", "focus", "full_reuse", "full_prefill_cached_vision",
           "full_prefill")
FOCUS = "conduit_focus"  # beside the default in the same rounds
RESULTS = Path(__file__).parent / "results"


def a4_page(seed: int) -> Image.Image:
    """An A4 page at 100 dpi (827 x 1169 px) with lines of text."""
    img = Image.new("RGB", (827, 1169), "white")
    draw = ImageDraw.Draw(img)
    for y in range(60, 1100, 28):
        draw.text((70, y), f"line {y} of page {seed}: totals, signatures and dates",
                  fill="black")
    return img


def _once(rt: ReuseRuntime, method: str, pages: list[PageInput],
          images: list[Image.Image], max_new_tokens: int) -> AnswerResult:
    if method == "full_prefill":
        return answering.answer_full_prefill(rt, ANSWER_PREFIX, [(p.label, im) for p, im in
                                                      zip(pages, images, strict=True)],
                                      QUESTION, max_new_tokens=max_new_tokens)
    choice = {"default": choose_policy(DEFAULT_POLICY),
              "focus": choose_policy(FOCUS),
              "full_reuse": choose_policy("full_reuse"),
              "full_prefill_cached_vision": choose_policy("full_prefill")}[method]
    return answering.answer(rt, AnswerRequest(ANSWER_PREFIX, pages, QUESTION, policy=choice,
                                              max_new_tokens=max_new_tokens))


def run(repeats: int = 5, max_new_tokens: int = 64) -> dict[str, Any]:
    """Time every method in rotated rounds; see the module docstring."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        vlm = load_vlm(MODEL, cache_dir=Path(tmp))
        rt = ReuseRuntime(vlm)
        images = [a4_page(i) for i in range(3)]
        kvs = rt.prefill_pages(images)
        pages = [PageInput(page_label("report.pdf", i + 1), kv) for i, kv in enumerate(kvs)]
        for method in METHODS:  # warm-up
            _once(rt, method, pages, images, max_new_tokens)
        got: dict[str, list[AnswerResult]] = {m: [] for m in METHODS}
        for rep in range(repeats):
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
            for method in order:
                got[method].append(_once(rt, method, pages, images, max_new_tokens))
    full = statistics.median(r.ttft_s for r in got["full_prefill"])
    same = all((a.token_ids, a.refreshed_visual_tokens, a.flops_used_lm)
               == (b.token_ids, b.refreshed_visual_tokens, b.flops_used_lm)
               for a, b in zip(got["default"], got["focus"], strict=True))
    rows = []
    for method, results in got.items():
        ttft = statistics.median(r.ttft_s for r in results)
        decode = statistics.median((len(r.token_ids) - 1) / (r.total_s - r.ttft_s)
                                   for r in results if len(r.token_ids) > 1)
        first = results[0]
        rows.append({"method": method, "ttft_ms_median": round(1e3 * ttft, 1),
                     "speedup_vs_full_prefill": round(full / ttft, 2),
                     "decode_tokens_per_s": round(decode, 1),
                     "answer_s_median": round(statistics.median(r.total_s for r in results), 3),
                     "tokens": len(first.token_ids), "flops_ratio_lm": round(
                         first.flops_ratio_lm, 4), "fallback": first.fallback,
                     "predicted": round(first.predicted_flops_lm / first.flops_full_lm, 4),
                     "fallback_at": round(first.fallback_flops_lm / first.flops_full_lm, 4),
                     "refreshed": first.refreshed_visual_tokens, "visual": first.visual_tokens,
                     "head_tokens": first.head_tokens})
    return {"model": MODEL, "pages": [kv.num_tokens for kv in kvs],
            "prompt_tokens": got["default"][0].prompt_tokens, "repeats": repeats,
            "max_new_tokens": max_new_tokens, "threads": 1, "default_same_as_focus": same,
            "command": shlex.join(["python", "-m", "lab.ttft.default_model", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d"), "rows": rows}


def write(doc: dict[str, Any], out: Path) -> None:
    """JSON at `out`, a markdown table beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# The default model on a 3-page question ({doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             f"`{doc['model']}`, pages of {doc['pages']} visual tokens, {doc['prompt_tokens']} "
             f"prompt tokens, {doc['max_new_tokens']}-token answers, one thread, medians of "
             f"{doc['repeats']} rotated rounds after a warm-up.", "",
             "| method | TTFT ms | speed-up vs full prefill | decode tokens/s | answer s | "
             "LM FLOPs | refreshed | fallback | predicted / fallback at |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    tail = ["", "`default` and `focus` refreshed as many tokens, spent the same LM FLOPs "
            f"and gave the same answer tokens in every round: {doc['default_same_as_focus']}."]
    for r in doc["rows"]:
        lines.append(f"| {r['method']} | {r['ttft_ms_median']} | {r['speedup_vs_full_prefill']}x"
                     f" | {r['decode_tokens_per_s']} | {r['answer_s_median']} | "
                     f"{r['flops_ratio_lm']} | {r['refreshed']} of {r['visual']} | "
                     f"{r['fallback']} | {r['predicted']} / {r['fallback_at']} |")
    out.with_suffix(".md").write_text("\n".join(lines + tail) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m lab.ttft.default_model [--repeats 5] [--out F]`."""
    p = argparse.ArgumentParser(prog="python -m lab.ttft.default_model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=RESULTS / "default_model.json")
    args = p.parse_args(argv)
    doc = run(args.repeats, args.max_new_tokens)
    write(doc, args.out)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
