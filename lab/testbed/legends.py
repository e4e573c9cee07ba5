"""Where a checkpoint fails legend questions: `python -m lab.testbed.legends --weights W
[--n 128] [--seed 0]`.

A legend record "3Q=G" answers its digit (3) under the legend "#1" and its letter (Q) under
"#2"; the key cell must read the legend's cell on page 1 to know which. For `n` legend
questions over 6 shown pages (evidence plus distractors, as in the final table), under full
prefill, each column is counted apart:

- `answer_right` / `answer_other_value` / `answer_else`: the answer token is right, names
  the record's other value (the legend misread), or anything else;
- `L{l}_right` / `L{l}_other_value` / `L{l}_key`: the key cell names the right value / the
  other value / its own key glyph after decoder layer l (read through the final norm and
  the LM head, as the training targets are; after the last layer that is the cell's own
  prediction, whose target is the resolved value).

A question reads its key cell at layer `look_q_layer` (4 of 5), from the residual after the
layer before: a value the key cell resolves only in its last layer is there, but too late.
`answer_right_where_read_right` / `_read_wrong` split the right answers by whether the key
cell named the right value after that layer before (`L{last - 1}_right`).

Public API:
  legend_samples(n, seed) -> list[Sample]
  legend_counts(model, layouts, patches, n, seed) -> dict[str, dict[str, int]]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

from conduit_core.model.testbed_model import WEIGHTS
from lab.testbed.batches import GlyphPatches, Layouts, Sample, batch_hidden, make_batch, shown_pages
from lab.testbed.pairs import SHOWN, load_model
from lab.testbed.task import PAGE, make_document


def legend_samples(n: int, seed: int) -> list[Sample]:
    """`n` legend questions (generator `random.Random(f"legends:{seed}")`), `SHOWN` pages."""
    rng = random.Random(f"legends:{seed}")
    out = []
    for i in range(n):
        doc = make_document(rng, PAGE)
        question = doc.question("legend", rng)
        pages = shown_pages(doc, question.evidence_indices, SHOWN, rng)
        out.append(Sample(doc, question, pages, f"l{i:03d}.pdf"))
    return out


@torch.no_grad()
def legend_counts(model: Any, layouts: Layouts, patches: GlyphPatches, n: int, seed: int,
                  batch_size: int = 16) -> dict[str, dict[str, int]]:
    """Counts per legend column ("digit", "letter") over `n` questions (see module doc)."""
    samples = legend_samples(n, seed)
    head, norm = model.lm_head, model.model.language_model.norm
    cols, last = PAGE.cols, len(model.model.language_model.layers) - 1
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for i in range(0, n, batch_size):
        chunk = samples[i:i + batch_size]
        batch = make_batch(chunk, layouts, patches)
        hidden, layers = batch_hidden(model, batch, True)  # (B, N, hidden), per layer
        assert layers is not None
        rows = batch.answer.view(len(chunk), 2, 3)  # (B, value + end of turn, 3)
        answer = head(hidden[rows[:, 0, 0], rows[:, 0, 1]]).argmax(-1).tolist()  # (B,)
        for b, s in enumerate(chunk):
            record = s.question.records[0]
            row = s.doc.pages[record.page][record.cell // cols]
            digit, letter = row[record.cell % cols - 3], row[record.cell % cols - 2]
            column = "digit" if s.doc.legend_column == 1 else "letter"
            want, other = (digit, letter) if column == "digit" else (letter, digit)
            want_id, other_id = layouts.token_of(want), layouts.token_of(other)
            _, _, starts, _ = layouts.layout(s)
            cell = starts[s.pages.index(record.page)] + 1 + record.cell  # the key cell
            lens = [int(head(hidden[b, cell] if layer == last
                             else norm(layers[layer + 1][b, cell])).argmax(-1))
                    for layer in range(last + 1)]  # what it names after each layer
            c = counts[column]
            c["n"] += 1
            right, read = answer[b] == want_id, lens[last - 1] == want_id  # layer `last` reads
            c["answer_right" if right else
              "answer_other_value" if answer[b] == other_id else "answer_else"] += 1
            c["answer_right_where_read_right"] += int(right and read)
            c["answer_right_where_read_wrong"] += int(right and not read)
            for layer, tok in enumerate(lens):
                c[f"L{layer}_right"] += int(tok == want_id)
                c[f"L{layer}_other_value"] += int(tok == other_id)
                c[f"L{layer}_key"] += int(tok == layouts.token_of(record.key))
    return {k: dict(v) for k, v in sorted(counts.items())}


def main() -> None:
    """Print the legend counts of one checkpoint as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, default=WEIGHTS)
    ap.add_argument("--n", type=int, default=128, help="legend questions")
    ap.add_argument("--seed", type=int, default=0, help="legend question generator seed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, layouts, patches = load_model(args.weights)
    print(json.dumps({"weights": str(args.weights), "n": args.n, "seed": args.seed,
                      "legends": legend_counts(model, layouts, patches, args.n, args.seed)}))


if __name__ == "__main__":
    main()
