"""`label_refresh="read"`: after a scoring pass a refresh recomputes only the stale labels
the question reads most (`Layout.read_label_rows`), chosen from the scores on the device.

* choosing every stale label, the refresh is "always"'s, bit for bit (rows, states, FLOPs);
* choosing fewer, it recomputes the labels of the most score mass (ranked as documented) and
  no other, for fewer FLOPs; without a scoring pass it recomputes what "always" does;
* the answer's FLOPs are predicted within 5% and charged as a FLOP counter counts them;
* on the accelerator's path the prefill half reads nothing back.
"""

from __future__ import annotations

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.answer_types import AnswerRequest
from conduit_core.passes.assembly import Assembly
from conduit_core.policies import choose_policy
from conduit_core.prompt.layout import Layout
from lab import answering
from lab.ttft.host_syncs import count_prefill_syncs
from lab.ttft.model import bench_pages
from lab.ttft.op_count import accelerator_path, narrow_vlm
from tests.core.helpers import IMAGES, own_flops
from tests.core.test_one_plan import counted_answer

PREFIX = "You answer questions about the document pages shown. Cite pages by their labels."
QUESTION = "What is the total amount due, and who signed?"
LABELS = ["[report.pdf p.1]", "[report.pdf p.2]", "[annex.pdf p.7]", "[memo.pdf p.12]"]


def _pages(rt: ReuseRuntime) -> list[PageInput]:
    kvs = rt.prefill_pages([IMAGES[k] for k in "abca"])
    return [PageInput(label, kv) for label, kv in zip(LABELS, kvs, strict=True)]


def _refresh(rt: ReuseRuntime, pages: list[PageInput], policy: str,
             read_labels: int | None = None) -> tuple[Assembly, torch.Tensor, torch.Tensor,
                                                       float]:
    """An answer's prefill step by step (`read_labels` set on its layout before the policy
    runs): the assembly, the last row's state, the rows computed and their FLOPs."""
    assembly = rt.reuse.assemble(PREFIX, pages, QUESTION, last_only=True)
    if read_labels is not None:
        assembly.layout.read_labels = read_labels
    ctx = rt.reuse.policy_context(assembly, 0.1, 0)
    visual = choose_policy(policy).select(ctx)
    hidden, computed = rt.reuse.refresh(assembly, visual, ctx.resume)
    return assembly, hidden, computed.cpu(), rt.reuse.refresh_flops(assembly, computed.cpu(),
                                                                      ctx.resume)


def _stale_rows(layout: Layout) -> list[torch.Tensor]:
    """Each stale label's rows (all but the one right after the head)."""
    return [torch.arange(s.start, s.stop) for s in layout.labels if s.start != layout.head]


@pytest.mark.parametrize("policy", ["conduit", "conduit_per_page"])
def test_choosing_every_label_is_always(runtime: ReuseRuntime, policy: str) -> None:
    read = ReuseRuntime(runtime.vlm, label_refresh="read", never_above_full=False)
    always = ReuseRuntime(runtime.vlm, label_refresh="always", never_above_full=False)
    pages = _pages(read)
    _, want, want_rows, want_flops = _refresh(always, pages, policy)
    asm, got, rows, flops = _refresh(read, pages, policy, read_labels=len(LABELS))
    assert asm.layout.read_label_count() == sum(r.numel() for r in _stale_rows(asm.layout))
    assert torch.equal(rows, want_rows)
    assert torch.equal(got, want)
    assert flops == want_flops


@pytest.mark.parametrize("read_labels", [1, 2])
def test_the_labels_read_most_are_recomputed(runtime: ReuseRuntime, read_labels: int) -> None:
    read = ReuseRuntime(runtime.vlm, label_refresh="read", never_above_full=False)
    always = ReuseRuntime(runtime.vlm, label_refresh="always", never_above_full=False)
    pages = _pages(read)
    asm, _, rows, flops = _refresh(read, pages, "conduit_per_page", read_labels)
    assert asm.stale is not None
    weighted = asm.stale.weighted.cpu()  # (N,)
    stale = _stale_rows(asm.layout)
    mass = torch.stack([weighted[r].sum() for r in stale])  # (S,)
    order = torch.argsort(mass, descending=True, stable=True).tolist()
    count = sum(sorted((r.numel() for r in stale), reverse=True)[:read_labels])
    want = torch.cat([stale[i] for i in order])[:count].sort().values  # (C,)
    every = torch.cat(stale)
    assert torch.equal(every[torch.isin(every, rows)], want)
    assert flops < _refresh(always, pages, "conduit_per_page")[3]
    # full reuse runs no scoring pass: no scores to choose from, every stale label as "always"
    assert torch.equal(_refresh(read, pages, "full_reuse")[2],
                       _refresh(always, pages, "full_reuse")[2])


def test_predicted_and_charged_as_computed(runtime: ReuseRuntime) -> None:
    rt = ReuseRuntime(runtime.vlm, label_refresh="read", never_above_full=False)
    pages = _pages(rt)
    request = AnswerRequest(PREFIX, pages, QUESTION, policy=choose_policy("conduit_per_page"),
                            budget=0.1, max_new_tokens=1)
    warm = answering.answer(rt, request)
    assert warm.predicted_flops_lm == pytest.approx(own_flops(warm), rel=0.05)
    result, counted = counted_answer(rt, request)
    assert counted == pytest.approx(result.flops_used_lm, rel=0.01)


def test_the_passes_read_nothing_back() -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runtime = ReuseRuntime(narrow_vlm(256), label_refresh="read")
        kvs = runtime.prefill_pages(bench_pages(8, 256))
        with accelerator_path():
            counter = count_prefill_syncs(runtime, kvs, "conduit_per_page")
    finally:
        torch.set_num_threads(saved)
    assert counter.opened and counter.closed
    assert counter.total == 0, dict(counter.sites)
