"""Which page tokens a policy refreshes on the testbed, against the token that matters (the
asked record's key cell), per family: `python -m lab.testbed.choices --n 300 --out FILE`.

Over the probe's samples (`lab.testbed.probe.gold_samples`), each policy's refreshed set at
`--budget` is split by where its tokens sit: the asked key cell, other key cells (the results
of other records), cells on the asked record's page, cells on the other page(s), blank cells,
page delimiters.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch

from conduit_core.answer_types import PageInput
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from lab.testbed.batches import Sample, page_image
from lab.testbed.probe import gold_samples, load_checkpoint_vlm, refreshed_cells
from lab.testbed.task import COLS
from worker.answer_job import ANSWER_PREFIX, page_label


def _where(s: Sample, at: tuple[int, int] | None, keys: set[tuple[int, int]]) -> str:
    """The kind of token a refreshed (page, cell) is, for sample `s`."""
    if at is None:
        return "page delimiters"
    page, cell = at
    if at == (s.record.page, s.record.cell):
        return "the asked key cell"
    if at in keys:
        return "other key cells"
    if s.doc.pages[page][cell // COLS][cell % COLS] == " ":
        return "blank cells"
    return "other cells, asked record's page" if page == s.record.page else \
        "other cells, other pages"


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--policies", default="conduit,conduit_no_amp,conduit_per_page,epic")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS), never_above_full=False)
    tally: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for s in gold_samples(args.n):
        kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        pages = [PageInput(label=page_label(s.doc_name, p + 1), kv=kv)
                 for p, kv in zip(s.pages, kvs, strict=True)]
        assembly = runtime.assemble(ANSWER_PREFIX, pages, s.question)
        keys = {(r.page, r.cell) for r in s.doc.records if r.page in s.pages}
        for policy in args.policies.split(","):
            chosen = refreshed_cells(runtime, assembly, s, policy, args.budget)
            t = tally[(s.record.family, policy)]
            t["questions"] += 1
            t["key_cell_refreshed"] += (s.record.page, s.record.cell) in chosen
            t.update(f"tokens: {_where(s, at, keys)}" for at in chosen)
    rows = [{"family": fam, "policy": pol, "budget": args.budget, **dict(c)}
            for (fam, pol), c in sorted(tally.items())]
    args.out.write_text(json.dumps({"command": f"python -m lab.testbed.choices --n {args.n}"
                                    f" --budget {args.budget} --policies {args.policies}",
                                    "rows": rows}, indent=1))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
