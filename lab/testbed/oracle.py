"""What a split record's answer needs beyond what the default refreshes: an oracle test.

A split question's key cell is the first cell of its page; it reads the value ending the page
before (`Document.source`), which the question itself does not look at. The default
refreshes the key cell in every question, yet keeps only about 96% of full prefill's split
answers (docs/TESTBED.md, "How sure"). Here each split question (probe samples, evidence
plus distractors) is answered by full prefill, by a policy, by the policy plus the source
cell (one more token), by the policy plus one other cell of the source's page that the
policy left stale (the control: one more token anywhere there), by the policy plus the key
page's first row (the key cell and the cells after it on its row, which read the unresolved
key in the page's own prefill) and by the policy plus another row of that page (its control),
on the same pages:

    python -m lab.testbed.oracle --weights W --n 300 --seed 9191 [--policy P] [--budget B]

prints a JSON line per arm: the share answered right and the share whose source cell the
policy refreshed on its own.

Public API:
  ARMS = ("full_prefill", "policy_alone", "plus_source", "plus_other_cell",
          "plus_key_row", "plus_other_row")
  split_oracle(vlm, n, seed, policy, budget) -> dict[arm, float] and "source_refreshed"
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.assembly import Assembly
from conduit_core.loader import LoadedVLM
from conduit_core.policies import POLICIES, get_policy, register_policy
from conduit_core.policy_context import PolicyContext, RefreshPolicy
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from lab.testbed.batches import Sample, page_image
from lab.testbed.probe import MAX_NEW_TOKENS, load_checkpoint_vlm, page_cell_rows, probe_samples
from worker.prompt import ANSWER_PREFIX, page_label

ARMS = ("full_prefill", "policy_alone", "plus_source", "plus_other_cell", "plus_key_row",
        "plus_other_row")
_ORACLE = "oracle_split"  # registered for this process only


def _source_rows(assembly: Assembly, s: Sample) -> tuple[int, range] | None:
    """The sequence index of the asked split record's source cell and the rows of its page's
    cells; None if that page is not shown."""
    found = s.doc.source(s.question.records[0])
    if found is None or found[0] not in s.pages:
        return None
    rows = page_cell_rows(assembly, s, found[0])
    return rows[found[1]], rows


def _key_page_rows(assembly: Assembly, s: Sample, row: int) -> list[int]:
    """The sequence indices of row `row` of the asked record's (key's) page."""
    cols = s.doc.shape.cols
    return list(page_cell_rows(assembly, s, s.question.records[0].page)[row * cols:
                                                                       (row + 1) * cols])


def split_oracle(vlm: LoadedVLM, n: int = 300, seed: int = 9191,
                 policy: str = "conduit_per_page", budget: float = 0.1) -> dict[str, float]:
    """The share of `n` split questions each arm answers right (see the module docstring)."""
    runtime = ReuseRuntime(vlm, never_above_full=False)
    base = get_policy(policy)
    extra: list[int] = []
    register_policy(_ORACLE, _with_rows(base, extra))
    try:
        return _answer_splits(runtime, base, extra, n, seed, budget)
    finally:
        POLICIES.pop(_ORACLE, None)  # leave the registry as the product ships it


def _answer_splits(runtime: ReuseRuntime, base: RefreshPolicy, extra: list[int], n: int,
                   seed: int, budget: float) -> dict[str, float]:
    """`split_oracle`'s loop, with the oracle policy registered (its rows: `extra`)."""
    rng = random.Random(f"oracle:{seed}")
    right = dict.fromkeys(ARMS, 0)
    asked = covered = 0
    samples = (s for s in probe_samples(20 * n, seed, "distractors")
               if s.question.family == "split")
    for s in samples:
        images = [page_image(s.doc.pages[p]) for p in s.pages]
        labels = [page_label(s.doc_name, p + 1) for p in s.pages]
        kvs = runtime.prefill_pages(images)
        inputs = [PageInput(label=lab, kv=kv) for lab, kv in zip(labels, kvs, strict=True)]
        assembly = runtime.assemble(ANSWER_PREFIX, inputs, s.text)
        found = _source_rows(assembly, s)
        if found is None:
            continue
        source, page_rows = found
        chosen = set(base(runtime.policy_context(assembly, budget, 0)).tolist())
        covered += source in chosen
        control = rng.choice([r for r in page_rows if r not in chosen and r != source])
        key_row = _key_page_rows(assembly, s, 0)
        other_row = _key_page_rows(assembly, s, rng.randrange(1, s.doc.shape.rows))
        full = runtime.answer_full_prefill(ANSWER_PREFIX, list(zip(labels, images, strict=True)),
                                           s.text, max_new_tokens=MAX_NEW_TOKENS)
        right["full_prefill"] += full.text.strip() == s.question.answer
        for arm, rows in (("policy_alone", []), ("plus_source", [source]),
                          ("plus_other_cell", [control]), ("plus_key_row", key_row),
                          ("plus_other_row", other_row)):
            extra[:] = rows
            res = runtime.answer(AnswerRequest(
                prefix=ANSWER_PREFIX, pages=inputs, question=s.text,
                policy=_ORACLE, budget=budget, max_new_tokens=MAX_NEW_TOKENS, seed=0))
            right[arm] += res.text.strip() == s.question.answer
        asked += 1
        if asked == n:
            break
    out = {arm: right[arm] / max(asked, 1) for arm in ARMS}
    return {**out, "source_refreshed": covered / max(asked, 1), "questions": float(asked)}


def _with_rows(base: Callable[[PolicyContext], torch.Tensor],
               extra: list[int]) -> Callable[[PolicyContext], torch.Tensor]:
    """`base`'s choice plus the rows in `extra` (read at call time)."""
    def select(ctx: PolicyContext) -> torch.Tensor:
        rows = base(ctx).to(torch.long).cpu()  # (k,)
        return torch.cat([rows, torch.tensor(extra, dtype=torch.long)]).unique()
    return select


def main() -> None:
    """Run the oracle on one checkpoint and print one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, default=WEIGHTS)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=9191)
    ap.add_argument("--policy", default="conduit_per_page")
    ap.add_argument("--budget", type=float, default=0.1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = split_oracle(load_checkpoint_vlm(args.weights), args.n, args.seed, args.policy,
                          args.budget)
    print(json.dumps({"weights": str(args.weights), "policy": args.policy,
                      "budget": args.budget, **result}))


if __name__ == "__main__":
    main()
