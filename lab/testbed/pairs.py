"""Where a checkpoint fails pair questions, and a checkpoint's held-out exact match on any
training seed's held-out set: `python -m lab.testbed.pairs --weights W [--n 48]
[--heldout-seed S]`.

A pair answer is three tokens and the end of the turn ("5 7"): the first value is read at
the generation prompt's last position, the second at the space after the first value. Under
teacher forcing (the greedy answer's tokens when every earlier one is right), each value
position is counted as right, as the *other* asked key's value (the question's keys swapped
or read twice), or as anything else; `both` counts the questions with both values right.
The held-out set is the one `conduit-lab testbed train --seed S` evaluates on
(`random.Random(f"heldout:{S}")`, 256 questions, 4-6 pages shown), so weights can be
compared on a set neither was trained or evaluated on.

Public API:
  load_model(weights) -> (model, layouts, patches)
  pair_positions(model, layouts, patches, n, seed) -> dict[str, int]
  heldout(model, layouts, patches, seed) -> dict[str, float]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from conduit_core.model.testbed_model import WEIGHTS
from lab.testbed.batches import GlyphPatches, Layouts, batch_hidden, draw_sample, make_batch
from lab.testbed.probe import load_checkpoint_vlm
from lab.testbed.task import PAGE
from lab.testbed.train import heldout_accuracy, heldout_samples

SHOWN = 6  # pages shown per pair question, as in the final table


def load_model(weights: Path) -> tuple[Any, Layouts, GlyphPatches]:
    """The testbed model with `weights` (a checkpoint or a weights file), in eval mode, with
    the layouts and glyph patches its batches need."""
    vlm = load_checkpoint_vlm(weights)
    return vlm.model, Layouts(vlm.adapter, PAGE), GlyphPatches(vlm.processor)


@torch.no_grad()
def pair_positions(model: Any, layouts: Layouts, patches: GlyphPatches, n: int, seed: int,
                   batch_size: int = 16) -> dict[str, int]:
    """Counts over `n` pair questions (generator `random.Random(f"pairs:{seed}")`) of what
    each value position predicts: `first_right`, `first_other_key`, `first_else`, the same
    for `second_*`, and `both`."""
    rng = random.Random(f"pairs:{seed}")
    samples = [draw_sample(rng, PAGE, 0, SHOWN, pair_share=1.0) for _ in range(n)]
    token_of = layouts.token_of
    counts: Counter[str] = Counter()
    for i in range(0, n, batch_size):
        chunk = samples[i:i + batch_size]
        batch = make_batch(chunk, layouts, patches)
        hidden, _ = batch_hidden(model, batch)  # (B, N, hidden)
        rows = batch.answer  # (T, 3): batch row, logit row, target token; 4 per question
        pred = model.lm_head(hidden[rows[:, 0], rows[:, 1]]).argmax(-1).view(len(chunk), 4)
        for s, p in zip(chunk, pred.tolist(), strict=True):
            first, second = (token_of(r.answer) for r in s.question.records)
            for name, got, want, other in (("first", p[0], first, second),
                                           ("second", p[2], second, first)):
                kind = "right" if got == want else "other_key" if got == other else "else"
                counts[f"{name}_{kind}"] += 1
            counts["both"] += int(p[0] == first and p[2] == second)
    return {k: counts[k] for k in ("first_right", "first_other_key", "first_else",
                                   "second_right", "second_other_key", "second_else", "both")}


def heldout(model: Any, layouts: Layouts, patches: GlyphPatches, seed: int) -> dict[str, float]:
    """Exact match per family on the held-out set of training seed `seed`."""
    acc = heldout_accuracy(model, layouts, patches, heldout_samples(seed))
    return {k: round(v, 4) for k, v in acc.items()}


def main() -> None:
    """Print the pair positions (and the held-out exact match) of one checkpoint as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, default=WEIGHTS)
    ap.add_argument("--n", type=int, default=48, help="pair questions")
    ap.add_argument("--seed", type=int, default=0, help="pair question generator seed")
    ap.add_argument("--heldout-seed", type=int, default=None,
                    help="also the held-out exact match of `train --seed S`'s set")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, layouts, patches = load_model(args.weights)
    out: dict[str, Any] = {"weights": str(args.weights), "n": args.n, "seed": args.seed,
                           "pairs": pair_positions(model, layouts, patches, args.n, args.seed)}
    if args.heldout_seed is not None:
        out["heldout_seed"] = args.heldout_seed
        out["heldout"] = heldout(model, layouts, patches, args.heldout_seed)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
