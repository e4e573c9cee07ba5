"""The page-boundary candidate (`lab.testbed.variants.BoundaryRule`): where its base policy's
choice starts a page, the last tokens of the page before come too, inside the budget or on
top of it; `WithoutDelimiters`, the base's budget kept off the page delimiters; and
`SecondHop`, the rest of the budget to the stale tokens the base's rows read."""

from __future__ import annotations

import torch

from conduit_core.answer_types import PageInput
from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.testbed_model import WEIGHTS
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.policies import get_policy
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.runtime import ReuseRuntime
from lab.testbed.batches import page_image
from lab.testbed.probe import load_checkpoint_vlm, probe_samples
from lab.testbed.variants import BoundaryRule, SecondHop, WithoutDelimiters, at_k, read_mass
from worker.prompt import ANSWER_PREFIX, page_label


def _context() -> PolicyContext:
    s = next(iter(probe_samples(5, 3, "distractors")))
    runtime = ReuseRuntime(load_checkpoint_vlm(WEIGHTS))
    kvs = runtime.prefill_pages([page_image(s.doc.pages[p]) for p in s.pages])
    assembly = runtime.reuse.assemble(ANSWER_PREFIX, [
        PageInput(page_label(s.doc_name, p + 1), kv)
        for p, kv in zip(s.pages, kvs, strict=True)], s.text)
    return runtime.reuse.policy_context(assembly, 0.1, 0)


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


def test_second_hop_adds_what_the_refreshed_rows_read() -> None:
    ctx = _context()
    base = get_policy("conduit_per_page")
    first = base(at_k(ctx, round(0.8 * ctx.k)))  # runs the scoring pass (on the copy)
    n = ctx.layout.n
    keys = ctx.cache.keys[:, :, :, :n].clone()  # after the scoring pass's writes
    rows = SecondHop(base, 0.8)(ctx)
    # the probe ran on a copy; the scoring pass stops at the default's depth, so the text
    # rows of the layers after it hold what the cache held before (any bits, NaN too)
    torch.testing.assert_close(ctx.cache.keys[:, :, :, :n], keys, rtol=0, atol=0,
                               equal_nan=True)
    assert ctx.extra_flops > 0  # the probe is charged
    chosen, more = set(first.tolist()), set(rows.tolist()) - set(first.tolist())
    assert rows.numel() == ctx.k and chosen <= set(rows.tolist())
    read, _ = read_mass(ctx, first.to(torch.long).cpu().sort().values, None)
    rest = sorted(set(ctx.visual_rows.tolist()) - chosen)
    assert min(read[sorted(more)]) >= max(read[sorted(set(rest) - more)])  # the most read


def test_the_probe_reads_a_distribution_and_attends_as_the_plain_pass() -> None:
    ctx = _context()
    rows = torch.tensor([70, 100, 340, 620, 900])  # page tokens on four pages
    read, probed = read_mass(ctx, rows, None)  # (N,)
    layers, heads = len(ctx.adapter.layers), ctx.adapter.text_config.num_attention_heads
    assert abs(float(read.sum()) - layers * heads * rows.numel()) < 1e-3  # each row's softmax
    assert float(read[int(rows.max()) + 1:].abs().sum()) == 0.0  # causal: nothing after
    plain = KVCache(ctx.cache.keys.clone(), ctx.cache.values.clone())
    hidden = ctx.embeds[rows].unsqueeze(0)  # (1, R, hidden)
    forward_rows(ctx.adapter, plain, hidden, rows, ctx.layout.position_ids[:, rows].unsqueeze(1),
                 n_keys=ctx.layout.n)
    for layer in range(1, layers):  # written from the layer before's attention output
        torch.testing.assert_close(probed.keys[layer][:, :, rows], plain.keys[layer][:, :, rows],
                                   rtol=1e-4, atol=1e-4)


def test_second_hop_charges_its_scoring_pass_and_its_probe() -> None:
    base = get_policy("conduit_per_page")
    hop = _context()
    rows = SecondHop(base, 0.8)(hop)  # runs the scoring pass itself, on a smaller budget
    alone = _context()
    first = base(alone)  # the same scoring pass, charged to this context
    scoring = alone.extra_flops
    read_mass(alone, base(at_k(alone, round(0.8 * alone.k))).to(torch.long).cpu().sort().values,
              None)
    probe = alone.extra_flops - scoring
    assert scoring > 0 and probe > 0 and first.numel() == rows.numel()
    assert abs(hop.extra_flops - (scoring + probe)) <= 1e-6 * hop.extra_flops
