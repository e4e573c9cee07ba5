"""The page-boundary candidate (`lab.testbed.variants.BoundaryRule`): where its base policy's
choice starts a page, the last tokens of the page before come too, inside the budget or on
top of it; and `WithoutDelimiters`, the base's budget kept off the page delimiters."""

from __future__ import annotations

import torch

from conduit_core.answer_types import PageInput
from conduit_core.policies import get_policy
from conduit_core.policy_context import PolicyContext
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from lab.testbed.batches import page_image
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from lab.testbed.variants import BoundaryRule, WithoutDelimiters
from worker.prompt import ANSWER_PREFIX, page_label


def _context() -> PolicyContext:
    s = next(iter(probe_samples(5, 3, "distractors")))
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS))
    kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
    assembly = runtime.assemble(ANSWER_PREFIX, [
        PageInput(page_label(s.doc_name, p + 1), kv)
        for p, kv in zip(s.pages, kvs, strict=True)], s.text)
    return runtime.policy_context(assembly, 0.1, 0)


def test_a_chosen_page_start_brings_the_end_of_the_page_before() -> None:
    ctx = _context()
    first, second = ctx.layout.segments[0], ctx.layout.segments[1]
    last = ctx.layout.segments[-1]
    calls: list[int] = []

    def base(c: PolicyContext) -> torch.Tensor:  # page 2's first token, then the last page's
        calls.append(c.k)  # second token on
        return torch.tensor([second.start + 1, *range(last.start + 2, last.start + c.k + 1)])

    rows = BoundaryRule(base, 16)(ctx).tolist()
    end = list(range(first.stop - 17, first.stop - 1))  # before page 1's closing delimiter
    assert set(end) <= set(rows) and second.start + 1 in rows
    assert calls == [ctx.k, ctx.k - 16]  # then the budget left
    assert len(rows) == ctx.k  # inside the budget

    def elsewhere(c: PolicyContext) -> torch.Tensor:  # starts no page but the first
        return torch.arange(first.start + 1, first.start + 1 + c.k)

    assert torch.equal(BoundaryRule(elsewhere, 16)(ctx), elsewhere(ctx))


def test_on_top_of_the_budget_the_base_choice_stays_whole() -> None:
    ctx = _context()
    first, second = ctx.layout.segments[0], ctx.layout.segments[1]

    def base(c: PolicyContext) -> torch.Tensor:  # page 2's first token, then its next ones
        return torch.arange(second.start + 1, second.start + 1 + c.k)

    rows = BoundaryRule(base, 16, inside=False)(ctx).tolist()
    end = list(range(first.stop - 17, first.stop - 1))
    assert rows == sorted(end + base(ctx).tolist())  # every base row, and the 16 on top


def test_without_delimiters_the_budget_goes_to_page_tokens() -> None:
    ctx = _context()
    delimiters = {r for s in ctx.layout.segments for r in (s.start, s.stop - 1)}
    base = get_policy("conduit_per_page")
    assert delimiters & set(base(ctx).tolist())  # the default spends budget on them here
    rows = WithoutDelimiters(base)(ctx).tolist()
    assert len(rows) == ctx.k and not delimiters & set(rows)
    assert set(rows) <= set(ctx.visual_rows.tolist())
