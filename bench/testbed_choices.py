"""Which page tokens a policy refreshes on the testbed, against the token that matters (the
asked record's key cell), per family: `python -m bench.testbed_choices --n 300 --out FILE`.

For each generated sample (gold pages, the probe's sampling), each policy's refreshed set at
`--budget` is split by where its tokens sit: the asked key cell, other key cells (the results
of other records), cells on the asked record's page, cells on the other page(s), blank cells.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import torch

from conduit_core.answer_types import PageInput
from conduit_core.policies import get_policy
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from testbed.batches import Sample, draw_sample, page_image
from testbed.probe import load_checkpoint_vlm
from testbed.task import COLS
from worker.answer_job import ANSWER_PREFIX, page_label


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--policies", default="conduit,conduit_no_amp,conduit_per_page,epic")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS))
    rng = random.Random("probe:7")
    tally: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for _ in range(args.n):
        drawn = draw_sample(rng)
        s = Sample(drawn.doc, drawn.record, [p - 1 for p in drawn.record.evidence_pages],
                   drawn.doc_name)
        labels = [page_label(s.doc_name, p + 1) for p in s.pages]
        kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
        pages = [PageInput(label=lab, kv=kv) for lab, kv in zip(labels, kvs, strict=True)]
        assembly = runtime.assemble(ANSWER_PREFIX, pages, s.question)
        cells: dict[int, tuple[int, int]] = {}  # sequence index -> (page, cell)
        for seg, page in zip(assembly.layout.segments, s.pages, strict=True):
            for cell in range(len(s.doc.pages[page]) * COLS):
                cells[seg.start + 1 + cell] = (page, cell)
        keys = {(r.page, r.cell) for r in s.doc.records if r.page in s.pages}
        for policy in args.policies.split(","):
            ctx = runtime.policy_context(assembly, args.budget, 0)
            chosen = get_policy(policy)(ctx).tolist()
            t = tally[(s.record.family, policy)]
            t["questions"] += 1
            t["key_cell_refreshed"] += (s.record.page, s.record.cell) in {
                cells.get(i) for i in chosen}
            for i in chosen:
                page, cell = cells.get(i, (-1, -1))
                if page < 0:
                    t["tokens: page delimiters"] += 1
                elif (page, cell) == (s.record.page, s.record.cell):
                    t["tokens: the asked key cell"] += 1
                elif (page, cell) in keys:
                    t["tokens: other key cells"] += 1
                elif s.doc.pages[page][cell // COLS][cell % COLS] == " ":
                    t["tokens: blank cells"] += 1
                elif page == s.record.page:
                    t["tokens: other cells, asked record's page"] += 1
                else:
                    t["tokens: other cells, other pages"] += 1
    rows = [{"family": fam, "policy": pol, "budget": args.budget, **dict(c)}
            for (fam, pol), c in sorted(tally.items())]
    args.out.write_text(json.dumps({"command": f"python -m bench.testbed_choices --n {args.n}"
                                    f" --budget {args.budget} --policies {args.policies}",
                                    "rows": rows}, indent=1))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
