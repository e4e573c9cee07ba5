"""Which of the cells a split record needs each choice holds: the default, its smaller part,
and `SecondHop` (`lab.testbed.variants`).

The split oracle (`results/split_oracle.md`) found that refreshing the glyph cells of the
three rows above the source value, on the page before the key's, recovers full prefill's
split answers (its `plus_source_near_glyphs` arm). Here, on split questions with
distractors, each choice's share of those cells is counted: `conduit_per_page` at 10%, at
`first` of that budget (`SecondHop`'s first part), `SecondHop` at 10% (that part, then the
stale tokens its rows read most) and `conduit_per_page` at 20%.

    python -m lab.testbed.hop_reads --weights W --n 150 --seed 7373 [--first 0.8]

prints one JSON object: the near cells over all questions and how many each choice holds.

Public API:
  near_cells_held(vlm, n, seed, first=0.8) -> dict[str, int]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from conduit_core.model.loader import LoadedVLM
from conduit_core.policies import get_policy
from conduit_core.runtime import ReuseRuntime
from lab.testbed.oracle import near_glyph_rows, split_cases
from lab.testbed.probe import load_checkpoint_vlm
from lab.testbed.variants import SecondHop, at_k

CHOICES = ("default_10", "default_first", "second_hop_10", "default_20")


def near_cells_held(vlm: LoadedVLM, n: int, seed: int, first: float = 0.8) -> dict[str, int]:
    """Over `n` split questions: the near glyph cells (`near`) and how many of them each
    choice in `CHOICES` holds (`questions`: the questions counted)."""
    runtime = ReuseRuntime(vlm, never_above_full=False)
    base = get_policy("conduit_per_page")
    out = dict.fromkeys(("questions", "near", *CHOICES), 0)
    for case in split_cases(runtime, n, seed):
        assembly = case.assembly
        ctx = runtime.reuse.policy_context(assembly, 0.1, 0)
        chosen = {
            "default_10": base(ctx),
            "default_first": base(at_k(ctx, round(first * ctx.k))),
            "second_hop_10": SecondHop(base, first)(ctx),
            "default_20": base(runtime.reuse.policy_context(assembly, 0.2, 0)),
        }
        near = set(near_glyph_rows(assembly, case.sample, case.source))
        out["questions"] += 1
        out["near"] += len(near)
        for name, rows in chosen.items():
            out[name] += len(near & set(rows.tolist()))
    return out


def main() -> None:
    """Count the near cells each choice holds on one checkpoint."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--seed", type=int, default=7373)
    ap.add_argument("--first", type=float, default=0.8)
    args = ap.parse_args()
    print(json.dumps(near_cells_held(load_checkpoint_vlm(args.weights), args.n, args.seed,
                                     args.first)))


if __name__ == "__main__":
    main()
