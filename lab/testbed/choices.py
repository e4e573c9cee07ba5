"""Which page tokens a policy refreshes on the testbed, against the tokens that matter (the
asked records' key cells), per family: `python -m lab.testbed.choices --n 300 --out FILE`.

Over the probe's samples (`lab.testbed.probe.probe_samples`, gold pages or with distractors),
each policy's refreshed set at `--budget` is split by where its tokens sit: an asked key cell,
other key cells (the results of other records), cells on an asked record's page, cells on the
other pages, blank cells, page delimiters. `key_cell_refreshed` counts the questions whose
asked key cells (both, for a pair) were all refreshed.
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
from lab.testbed.probe import (
    PAGE_MODES,
    key_cells,
    load_checkpoint_vlm,
    probe_samples,
    refreshed_cells,
)
from worker.answer_job import ANSWER_PREFIX, page_label


def _where(s: Sample, at: tuple[int, int] | None, keys: set[tuple[int, int]]) -> str:
    """The kind of token a refreshed (page, cell) is, for sample `s`."""
    if at is None:
        return "page delimiters"
    if at in key_cells(s):
        return "the asked key cell"
    if at in keys:
        return "other key cells"
    page, cell = at
    cols = s.doc.shape.cols
    if s.doc.pages[page][cell // cols][cell % cols] == " ":
        return "blank cells"
    asked_pages = {r.page for r in s.question.records}
    return "other cells, asked record's page" if page in asked_pages else \
        "other cells, other pages"


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--pages", choices=PAGE_MODES, default="gold")
    parser.add_argument("--policies", default="conduit,conduit_no_amp,conduit_per_page,epic")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS), never_above_full=False)
    tally: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for s in probe_samples(args.n, pages=args.pages):
        kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        pages = [PageInput(label=page_label(s.doc_name, p + 1), kv=kv)
                 for p, kv in zip(s.pages, kvs, strict=True)]
        assembly = runtime.assemble(ANSWER_PREFIX, pages, s.text)
        keys = {(r.page, r.cell) for r in s.doc.records if r.page in s.pages}
        for policy in args.policies.split(","):
            chosen = refreshed_cells(runtime, assembly, s, policy, args.budget)
            t = tally[(s.question.family, policy)]
            t["questions"] += 1
            t["key_cell_refreshed"] += all(c in chosen for c in key_cells(s))
            t.update(f"tokens: {_where(s, at, keys)}" for at in chosen)
    rows = [{"family": fam, "policy": pol, "budget": args.budget, "pages": args.pages, **dict(c)}
            for (fam, pol), c in sorted(tally.items())]
    args.out.write_text(json.dumps({"command": f"python -m lab.testbed.choices --n {args.n}"
                                    f" --budget {args.budget} --pages {args.pages}"
                                    f" --policies {args.policies}",
                                    "rows": rows}, indent=1))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
