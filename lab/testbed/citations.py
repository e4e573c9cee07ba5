"""Does the page the question looked at most hold what it asked? `python -m lab.testbed.citations`

An answer reports, per page, how much the question looked at it in the scoring pass
(`AnswerResult.page_attention`, each cited page's `attention` in the service: the page's most
attended token, normalised over the pages). Over the probe's samples (evidence plus distractor
pages), this counts per family how often the pages holding the asked records' key cells are
the top-attended pages (the top one; the top two for a pair), by that peak and, for
comparison, by the page's total attention.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.model.testbed_model import WEIGHTS
from lab.testbed.batches import page_image
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from worker.prompt import ANSWER_PREFIX, page_label


def _top(values: list[float], k: int) -> set[int]:
    return set(sorted(range(len(values)), key=lambda i: -values[i])[:k])


def top_pages(runtime: ReuseRuntime, n: int, seed: int) -> dict[str, Counter[str]]:
    """Per family: questions, and how often the asked records' pages were the top pages by
    peak attention (`top_by_peak`) and by total attention (`top_by_total`)."""
    tally: dict[str, Counter[str]] = {}
    for s in probe_samples(n, seed, "distractors"):
        kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        pages = [PageInput(page_label(s.doc_name, p + 1), kv)
                 for p, kv in zip(s.pages, kvs, strict=True)]
        assembly = runtime.reuse.assemble(ANSWER_PREFIX, pages, s.text, last_only=True)
        scores, _ = runtime.reuse.scoring(assembly)
        peak = list(assembly.page_attention())
        attention = scores.attention.float().cpu()  # (N,)
        total = [float(attention[g.start:g.stop].sum()) for g in assembly.layout.segments]
        asked = {s.pages.index(r.page) for r in s.question.records}
        t = tally.setdefault(s.question.family, Counter())
        t["questions"] += 1
        t["top_by_peak"] += _top(peak, len(asked)) == asked
        t["top_by_total"] += _top(total, len(asked)) == asked
    return tally


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--weights", type=Path, default=WEIGHTS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runtime = ReuseRuntime(load_checkpoint_vlm(args.weights), never_above_full=False)
    tally = top_pages(runtime, args.n, args.seed)
    rows = [{"family": fam, **dict(c)} for fam, c in sorted(tally.items())]
    every = sum((Counter(r) for r in tally.values()), Counter())
    rows.append({"family": "all", **dict(every)})
    args.out.write_text(json.dumps({
        "command": f"python -m lab.testbed.citations --n {args.n} --seed {args.seed}"
                   f" --weights {args.weights}", "rows": rows}, indent=1))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
