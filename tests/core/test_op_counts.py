"""The prefill half of an answer issues a fixed number of operations a layer whatever the
number of pages, but for the CPU page load (issue 58, point 2).

Ops are aten operations that launch work, counted by `lab.ttft.op_count` (views, size
queries and allocations excluded: `LAUNCH_FREE`) on the narrow random-weight Qwen2.5-VL
(28 decoder layers at hidden 64, 256-token pages, one thread), set up and counted as
`conduit-lab bench overhead` does (`narrow_runtime`, `count_prefill`). Counted at 2, 8 and 32
pages, for CONDUIT at 10% (the registry's default `conduit_per_page`, and the paper's
`conduit`) and for a full prefill from the cached page embeddings (policy `full_prefill`):
* the whole prefill half (`ReuseRuntime.start_answer`: layout, page and label loads, plan,
  scoring pass, selection, refresh, first-token logits) less the page load stays within 10%
  across the page counts;
* the page load (`conduit_core.kv.page_loads.load_pages`) is what is left growing: on the CPU
  it turns each page from its own tensors (about 22 operations a page for all layers, a
  deliberate choice for the core's cache, not the accelerator's staged path); it is bounded
  here at `LOAD_PER_PAGE` ops a layer per page, so the whole prefill half grows by at most
  that much a page;
* the passes alone (scoring pass, refresh, logits: `PassCounting.passes`) stay within 10%, and
  CONDUIT's are at most `RATIO_BOUND` times full prefill's (the issue's 2.2).
All on the accelerator's attention path (`lab.ttft.op_count.accelerator_groups`: a masked row
subset attends in one sdpa call a layer; the CPU takes four, trading calls for keys read).
"""

from __future__ import annotations

import pytest
import torch

from lab.ttft.op_count import NARROW_LAYERS, count_prefill, narrow_runtime

PAGES = (2, 8, 32)
POLICIES = ("full_prefill", "conduit_per_page", "conduit")
FLAT = 0.10  # largest / smallest count across the page counts, less 1
LOAD_PER_PAGE = 1.0  # the CPU page load's ops a layer, per page
RATIO_BOUND = 2.2  # CONDUIT's passes over full prefill's, a layer

Counts = dict[str, dict[str, list[float]]]  # policy -> "whole" | "load" | "passes" -> by PAGES


@pytest.fixture(scope="module")
def counted() -> Counts:
    """Ops a layer of each policy's prefill half, its page load and its passes, by pages."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt, kvs = narrow_runtime(max(PAGES))
        out: Counts = {}
        for policy in POLICIES:
            rows: dict[str, list[float]] = {"whole": [], "load": [], "passes": []}
            for pages in PAGES:
                count = count_prefill(rt, kvs[:pages], policy)
                rows["whole"].append(count.ops.total / NARROW_LAYERS)
                rows["load"].append(count.ops.within["load_pages"] / NARROW_LAYERS)
                rows["passes"].append(count.passes / NARROW_LAYERS)
            out[policy] = rows
        return out
    finally:
        torch.set_num_threads(saved)


def _flat(counts: list[float]) -> bool:
    return max(counts) <= (1 + FLAT) * min(counts)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_prefill_half_but_the_page_load_does_not_grow_with_pages(counted: Counts,
                                                                     policy: str) -> None:
    rest = [w - ld for w, ld in zip(counted[policy]["whole"], counted[policy]["load"],
                                    strict=True)]
    assert _flat(rest), (policy, dict(zip(PAGES, rest, strict=True)))


@pytest.mark.parametrize("policy", POLICIES)
def test_the_page_load_is_bounded_by_page(counted: Counts, policy: str) -> None:
    load = counted[policy]["load"]
    assert min(load) > 0, (policy, load)  # the load is counted where it runs
    for pages, ops in zip(PAGES, load, strict=True):
        assert ops <= LOAD_PER_PAGE * pages, (policy, pages, ops)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_passes_do_not_grow_with_pages(counted: Counts, policy: str) -> None:
    counts = counted[policy]["passes"]
    assert _flat(counts), (policy, dict(zip(PAGES, counts, strict=True)))


@pytest.mark.parametrize("policy", ["conduit_per_page", "conduit"])
def test_conduit_stays_within_the_bound_of_full_prefill(counted: Counts, policy: str) -> None:
    for pages, ours, full in zip(PAGES, counted[policy]["passes"],
                                 counted["full_prefill"]["passes"], strict=True):
        assert ours <= RATIO_BOUND * full, (policy, pages, ours, full)
