"""Which page tokens a policy refreshes on the testbed, against the tokens that matter (the
asked records' key cells), per family: `python -m lab.testbed.choices --n 300 --out FILE`.

Over the probe's samples (`lab.testbed.probe.probe_samples`, gold pages or with distractors),
each policy's refreshed set at `--budget` is split by where its tokens sit: an asked key cell,
the rest of an asked record (its slot's cells before the key: "3Q=" of "3Q=G"), the cell an
asked key reads on another page (`Document.source`: the legend's digit, the named record's
key, the value before a page break), other key cells (the results of other records), cells on
an asked record's page, cells on the other pages, blank cells, page delimiters.
`key_cell_refreshed` counts the questions whose asked key cells (both, for a pair) were all
refreshed, `record_refreshed` those whose asked records were refreshed whole, and
`source_refreshed` those whose cross-page sources were all refreshed. `--weights` takes
another checkpoint than the committed one.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

import torch

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from conduit_core.answer_types import PageInput
from conduit_core.model.testbed_model import WEIGHTS
from conduit_core.runtime import ReuseRuntime
from lab.testbed.batches import Sample, page_image
from lab.testbed.probe import (
    PAGE_MODES,
    key_cells,
    load_checkpoint_vlm,
    probe_samples,
    refreshed_cells,
)
from lab.testbed.task import SLOT
from worker.prompt import ANSWER_PREFIX, page_label


def record_cells(s: Sample) -> set[tuple[int, int]]:
    """The (page, cell) of the asked records' cells before their key cells, in their slots."""
    cols = s.doc.shape.cols
    out = set()
    for r in s.question.records:
        start = r.cell - (r.cell % cols) % SLOT  # the slot's first cell
        out |= {(r.page, c) for c in range(start, r.cell)
                if s.doc.pages[r.page][c // cols][c % cols] != " "}
    return out


def source_cells(s: Sample) -> set[tuple[int, int]]:
    """The (page, cell) each asked key reads on another page (none for lookups, pairs)."""
    return {src for r in s.question.records if (src := s.doc.source(r)) is not None}


def _places(s: Sample) -> list[tuple[str, set[tuple[int, int]]]]:
    """The named kinds of cell of sample `s`, in the order a refreshed cell is matched."""
    keys = {(r.page, r.cell) for r in s.doc.records if r.page in s.pages}
    return [("the asked key cell", set(key_cells(s))),
            ("the rest of the asked record", record_cells(s)),
            ("the cell it reads on another page", source_cells(s)),
            ("other key cells", keys)]


def _where(s: Sample, at: tuple[int, int] | None,
           places: list[tuple[str, set[tuple[int, int]]]]) -> str:
    """The kind of token a refreshed (page, cell) is, for sample `s` (`places`: its
    `_places`, computed once a sample)."""
    if at is None:
        return "page delimiters"
    for kind, cells in places:
        if at in cells:
            return kind
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
    parser.add_argument("--weights", type=Path, default=WEIGHTS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runtime = ReuseRuntime(load_checkpoint_vlm(args.weights), never_above_full=False)
    tally: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for s in probe_samples(args.n, pages=args.pages):
        kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        pages = [PageInput(label=page_label(s.doc_name, p + 1), kv=kv)
                 for p, kv in zip(s.pages, kvs, strict=True)]
        assembly = runtime.reuse.assemble(ANSWER_PREFIX, pages, s.text)
        places = _places(s)
        asked, record, source = (cells for _, cells in places[:3])
        for policy in args.policies.split(","):
            chosen = refreshed_cells(runtime, assembly, s, policy, args.budget)
            refreshed = set(chosen)
            t = tally[(s.question.family, policy)]
            t["questions"] += 1
            t["key_cell_refreshed"] += asked <= refreshed
            t["record_refreshed"] += record <= refreshed
            t["source_refreshed"] += source <= refreshed
            t.update(f"tokens: {_where(s, at, places)}" for at in chosen)
    rows = [{"family": fam, "policy": pol, "budget": args.budget, "pages": args.pages, **dict(c)}
            for (fam, pol), c in sorted(tally.items())]
    args.out.write_text(json.dumps({"command": f"python -m lab.testbed.choices --n {args.n}"
                                    f" --budget {args.budget} --pages {args.pages}"
                                    f" --policies {args.policies} --weights {args.weights}",
                                    "rows": rows}, indent=1))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
