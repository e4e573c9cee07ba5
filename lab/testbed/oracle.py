"""What a split record's answer needs beyond what the default refreshes: an oracle test.

A split question's key cell is the first cell of its page; it reads the value ending the page
before (`Document.source`), which the question itself does not look at. The default
refreshes the key cell in every question, yet keeps only about 96% of full prefill's split
answers (lab/testbed/NOTES.md, "How sure"). Here each split question (probe samples, evidence
plus distractors) is answered by full prefill, by a policy, by the policy plus the source
cell (one more token), by the policy plus one other cell of the source's page that the
policy left stale (the control: one more token anywhere there), by the policy plus the key
page's first row (the key cell and the cells after it on its row, which read the unresolved
key in the page's own prefill), by the policy plus another row of that page (its control),
by the policy plus a whole shown page (the key's, the source's, or a distractor's: every row
of its segment) and by the policy plus every page (the sanity arm: every reused row
recomputed, which should answer as full prefill does). Parts of the source's page narrow
down what the whole page gives: the record ("7=", the source and the cell after it), its
last row (the record, then blank cells), that row plus the segment's end token, the end
token alone, the rest (the start token and every row above the last), the start token alone
and the rows above the last without it, split in halves (120 cells each) and by kind (the
cells holding a glyph, the blank ones), the row above the source's, the glyphs of the three
rows above it, and the cells above the source's record (its two columns); and the
delimiters of every shown page (their start tokens, or their start and end tokens). Two arms
need no knowledge of the answer, a rule a policy could apply: where the policy refreshed
the first cell of a page whose document page before is shown just before it, the last two
or four rows of that earlier page too (`plus_boundary_2`, `plus_boundary_4`); the mean number
of rows each adds to the policy's choice is reported (`*_rows`). On the same pages:

    python -m lab.testbed.oracle --weights W --n 600 --seed 9393 [--policy P] [--budget B]
        [--arms ARM,ARM,...]

prints one JSON line: each arm's share answered right, and the share whose source cell the
policy refreshed on its own. Results and what they show: lab/testbed/results/split_oracle.md.

Public API:
  ARMS = ("full_prefill", "policy_alone", "plus_source", "plus_other_cell",
          "plus_key_row", "plus_other_row", "plus_key_page", "plus_source_page",
          "plus_distractor_page", "plus_all_pages", "plus_source_record",
          "plus_source_row", "plus_source_tail", "plus_source_end", "plus_source_rest",
          "plus_source_start", "plus_source_body", "plus_source_upper", "plus_source_lower",
          "plus_source_glyphs", "plus_source_blanks", "plus_source_row_above",
          "plus_source_near_glyphs", "plus_source_columns", "plus_all_starts",
          "plus_all_delimiters", "plus_boundary_2", "plus_boundary_4")
  source_cell(assembly, sample) -> (source row, its page's cell rows) | None
  near_glyph_rows(assembly, sample, source) -> the plus_source_near_glyphs rows
  SplitCase, split_cases(runtime, n, seed) -> the first n split questions whose source page
      is shown, prefilled and assembled
  split_oracle(vlm, n, seed, policy, budget, arms=ARMS) -> dict[arm, float] and
      "source_refreshed" (and "distractor_shown": questions with a distractor page;
      "plus_boundary_*_rows": rows that arm added on average)
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.loader import LoadedVLM
from conduit_core.model.testbed_model import WEIGHTS
from conduit_core.passes.assembly import Assembly
from conduit_core.policies import POLICIES, choose_policy, get_policy, register_policy
from conduit_core.policies.policy_context import PolicyContext, RefreshPolicy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.testbed.batches import Sample, page_image
from lab.testbed.probe import MAX_NEW_TOKENS, load_checkpoint_vlm, page_cell_rows, probe_samples
from worker.prompt import ANSWER_PREFIX, page_label

ARMS = ("full_prefill", "policy_alone", "plus_source", "plus_other_cell", "plus_key_row",
        "plus_other_row", "plus_key_page", "plus_source_page", "plus_distractor_page",
        "plus_all_pages", "plus_source_record", "plus_source_row", "plus_source_tail",
        "plus_source_end", "plus_source_rest", "plus_source_start", "plus_source_body",
        "plus_source_upper", "plus_source_lower", "plus_source_glyphs", "plus_source_blanks",
        "plus_source_row_above", "plus_source_near_glyphs", "plus_source_columns",
        "plus_all_starts", "plus_all_delimiters", "plus_boundary_2", "plus_boundary_4")
_BOUNDARY = {"plus_boundary_2": 2, "plus_boundary_4": 4}  # arm -> rows of the earlier page
_ORACLE = "oracle_split"  # registered for this process only


def source_cell(assembly: Assembly, s: Sample) -> tuple[int, range] | None:
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


def _segment_rows(assembly: Assembly, s: Sample, page: int) -> list[int]:
    """Every sequence index of shown page `page`'s segment (delimiters included)."""
    seg = assembly.layout.segments[s.pages.index(page)]
    return list(range(seg.start, seg.stop))


def split_oracle(vlm: LoadedVLM, n: int = 300, seed: int = 9191,
                 policy: str = "conduit_per_page", budget: float = 0.1,
                 arms: tuple[str, ...] = ARMS) -> dict[str, float]:
    """The share of `n` split questions each arm in `arms` answers right (see the module
    docstring); a distractor-page arm counts only questions that show a distractor."""
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; known: {', '.join(ARMS)}")
    runtime = ReuseRuntime(vlm, never_above_full=False)
    base = get_policy(policy)
    extra: list[int] = []
    register_policy(_ORACLE, _with_rows(base, extra))
    try:
        return _answer_splits(runtime, base, extra, n, seed, budget, arms)
    finally:
        POLICIES.pop(_ORACLE, None)  # leave the registry as the product ships it


def _arm_rows(assembly: Assembly, s: Sample, source: int, page_rows: range,
              chosen: set[int], rng: random.Random) -> dict[str, list[int] | None]:
    """The rows each reuse arm adds to the policy's choice (None: the arm does not apply).
    The source cell opens its page's last row (`Document.source`)."""
    key_page = s.question.records[0].page
    control = rng.choice([r for r in page_rows if r not in chosen and r != source])
    other_row = _key_page_rows(assembly, s, rng.randrange(1, s.doc.shape.rows))
    distractors = [p for p in s.pages if p not in (key_page, key_page - 1)]
    distractor = rng.choice(distractors) if distractors else None
    source_page = _segment_rows(assembly, s, key_page - 1)  # [start token, cells, end token]
    body, glyphs = _source_body(assembly, s, source)
    half = len(body) // 2
    cols = s.doc.shape.cols
    return {
        "policy_alone": [], "plus_source": [source], "plus_other_cell": [control],
        "plus_key_row": _key_page_rows(assembly, s, 0), "plus_other_row": other_row,
        "plus_key_page": _segment_rows(assembly, s, key_page),
        "plus_source_page": source_page,
        "plus_distractor_page": (None if distractor is None
                                 else _segment_rows(assembly, s, distractor)),
        "plus_all_pages": [r for p in s.pages for r in _segment_rows(assembly, s, p)],
        "plus_source_record": [source, source + 1],  # the value and its "="
        "plus_source_row": list(range(source, source + cols)),  # the last row
        "plus_source_tail": list(range(source, source_page[-1] + 1)),  # and the end token
        "plus_source_end": [source_page[-1]],
        "plus_source_rest": list(range(source_page[0], source)),
        "plus_source_start": [source_page[0]],
        "plus_source_body": body,
        "plus_source_upper": body[:half], "plus_source_lower": body[half:],
        "plus_source_glyphs": glyphs, "plus_source_blanks": sorted(set(body) - set(glyphs)),
        "plus_source_row_above": body[-cols:],
        "plus_source_near_glyphs": near_glyph_rows(assembly, s, source),
        "plus_source_columns": [r for i, r in enumerate(body) if i % cols < 2],
        "plus_all_starts": [seg.start for seg in assembly.layout.segments],
        "plus_all_delimiters": [r for seg in assembly.layout.segments
                                for r in (seg.start, seg.stop - 1)],
        **{arm: _boundary_rows(assembly, s, chosen, n) for arm, n in _BOUNDARY.items()},
    }


def _source_body(assembly: Assembly, s: Sample, source: int) -> tuple[list[int], list[int]]:
    """The sequence indices of the source page's cells above its last row, and of those
    holding a glyph."""
    body = list(range(_segment_rows(assembly, s, s.question.records[0].page - 1)[0] + 1,
                      source))
    grid = "".join(s.doc.pages[s.question.records[0].page - 1])  # its glyphs, cell order
    return body, [r for i, r in enumerate(body) if grid[i] != " "]


def near_glyph_rows(assembly: Assembly, s: Sample, source: int) -> list[int]:
    """The glyph cells of the three rows above the source cell `source` (the split oracle's
    arm that recovers full prefill's split answers)."""
    body, glyphs = _source_body(assembly, s, source)
    return [r for r in glyphs if r >= body[-3 * s.doc.shape.cols]]


def _boundary_rows(assembly: Assembly, s: Sample, chosen: set[int], rows: int) -> list[int]:
    """The last `rows` rows of each shown page whose next document page is shown right after
    it with its first cell in `chosen` (a rule that needs no knowledge of the answer)."""
    out: list[int] = []
    for before, after in zip(s.pages, s.pages[1:], strict=False):
        if after == before + 1 and page_cell_rows(assembly, s, after)[0] in chosen:
            out += page_cell_rows(assembly, s, before)[-rows * s.doc.shape.cols:]
    return out


@dataclass(frozen=True)
class SplitCase:
    """One split question, its pages prefilled and assembled as the service answers it."""

    sample: Sample
    images: list[Image.Image]  # the shown pages, in order
    labels: list[str]  # their page labels
    inputs: list[PageInput]  # their page KV under those labels
    assembly: Assembly
    source: int  # the source cell's sequence index
    page_rows: range  # the sequence indices of its page's cells


def split_cases(runtime: ReuseRuntime, n: int, seed: int) -> Iterator[SplitCase]:
    """The first `n` split questions of `probe_samples(.., seed, "distractors")` whose source
    page is shown, each prefilled and assembled when it is asked for."""
    given = 0
    for s in probe_samples(20 * n, seed, "distractors"):
        if given == n:
            return
        if s.question.family != "split":
            continue
        images = [page_image(s.doc.pages[p]) for p in s.pages]
        labels = [page_label(s.doc_name, p + 1) for p in s.pages]
        kvs = runtime.prefill_pages(images)
        inputs = [PageInput(label=lab, kv=kv) for lab, kv in zip(labels, kvs, strict=True)]
        assembly = runtime.reuse.assemble(ANSWER_PREFIX, inputs, s.text)
        found = source_cell(assembly, s)
        if found is None:
            continue
        yield SplitCase(s, images, labels, inputs, assembly, *found)
        given += 1


def _answer_splits(runtime: ReuseRuntime, base: RefreshPolicy, extra: list[int], n: int,
                   seed: int, budget: float, arms: tuple[str, ...]) -> dict[str, float]:
    """`split_oracle`'s loop, with the oracle policy registered (its rows: `extra`)."""
    rng = random.Random(f"oracle:{seed}")
    right = dict.fromkeys(arms, 0)
    applied = dict.fromkeys(arms, 0)
    added = dict.fromkeys(_BOUNDARY, 0)
    asked = covered = 0
    for case in split_cases(runtime, n, seed):
        s, assembly, source, inputs = case.sample, case.assembly, case.source, case.inputs
        chosen = set(base(runtime.reuse.policy_context(assembly, budget, 0)).tolist())
        covered += source in chosen
        extras = _arm_rows(assembly, s, source, case.page_rows, chosen, rng)
        for arm in added:
            added[arm] += len(set(extras[arm] or []) - chosen)
        if "full_prefill" in arms:
            full = answering.answer_full_prefill(runtime,
                ANSWER_PREFIX, list(zip(case.labels, case.images, strict=True)), s.text,
                max_new_tokens=MAX_NEW_TOKENS)
            right["full_prefill"] += full.text.strip() == s.question.answer
            applied["full_prefill"] += 1
        for arm in arms:
            rows = extras.get(arm)
            if arm == "full_prefill" or rows is None:
                continue
            extra[:] = rows
            res = answering.answer(runtime, AnswerRequest(
                prefix=ANSWER_PREFIX, pages=inputs, question=s.text,
                policy=choose_policy(_ORACLE), budget=budget, max_new_tokens=MAX_NEW_TOKENS,
                seed=0))
            right[arm] += res.text.strip() == s.question.answer
            applied[arm] += 1
        asked += 1
    out = {arm: right[arm] / max(applied[arm], 1) for arm in arms}
    if "plus_distractor_page" in arms:
        out["distractor_shown"] = applied["plus_distractor_page"] / max(asked, 1)
    out.update({f"{arm}_rows": added[arm] / max(asked, 1) for arm in added if arm in arms})
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
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--seed", type=int, default=9393)
    ap.add_argument("--policy", default="conduit_per_page")
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated arms to run (default all: {', '.join(ARMS)})")
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = split_oracle(load_checkpoint_vlm(args.weights), args.n, args.seed, args.policy,
                          args.budget, tuple(args.arms.split(",")))
    print(json.dumps({"weights": str(args.weights), "policy": args.policy,
                      "budget": args.budget, **result}))


if __name__ == "__main__":
    main()
