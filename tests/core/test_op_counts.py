"""The prefill half of an answer issues a fixed number of operations a layer whatever the
number of pages, CONDUIT's at most `RATIO_BOUND` times full prefill's, in float32 and in bf16
(issue 58, point 2; issue 65).

Ops are aten operations that launch work, counted by `lab.ttft.op_count` (views, size
queries and allocations excluded: `LAUNCH_FREE`) on the narrow random-weight Qwen2.5-VL
(28 decoder layers at hidden 64, 256-token pages, one thread, fused projections), in float32
and in bf16 (where each norm and the scoring pass's float32 probabilities add casts), set up
and counted as
`conduit-lab bench overhead` does (`narrow_runtime`, `count_prefill`), on the accelerator's
path (`lab.ttft.op_count.accelerator_path`: one sdpa call a layer for a masked row subset,
pages in one batched copy, re-rotation in an accelerator's steps, the scoring pass's layers
computing their own attention output). Counted at 2, 8 and 32
pages, for CONDUIT at 10% (`conduit_per_page` on the runtime's defaults: the first 0.8 of
the layers scored, label_refresh "read": the product default; `conduit_focus`, which on these
random weights, diffuse attention, makes `conduit_per_page`'s choice after its one copy of
the scores to the host; and the paper's `conduit`, every layer scored) and for a full
prefill from the cached page embeddings (policy `full_prefill`):
* the whole prefill half (`lab.answering.start_answer`: layout, page and label loads, plan,
  scoring pass, selection, refresh, first-token logits) stays within 10% across the page
  counts, and each CONDUIT policy's is at most its `RATIO_BOUND` times full prefill's; the
  default's at most issue 65's `ISSUE_BOUND` (2.0);
* the passes alone (scoring pass, refresh, logits: `PhaseCounting.passes`, counted through
  the runtime's observer) do too;
* the page load (`load_pages`) issues the same operations at every page count (one batched
  copy, one join a tensor kind on the device, one re-rotation), so a loop over pages there
  shows at once (that it reads the pages' host tensors only in that copy:
  tests/core/test_page_loads.py);
* the CPU's own page load (each page turned in place, `PAGE_BY_PAGE`: fewer memory passes
  for more operations) grows by at most `CPU_LOAD_PER_PAGE` ops a layer a page.
"""

from __future__ import annotations

import pytest
import torch

from conduit_core.policies.choice import DEFAULT_POLICY
from lab.ttft.op_count import NARROW_LAYERS, count_prefill, narrow_runtime

PAGES = (2, 8, 32)
POLICIES = ("full_prefill", "conduit_per_page", "conduit_focus", "conduit")
FLAT = 0.10  # largest / smallest count across the page counts, less 1
DTYPES = ("float32", "bfloat16")
# CONDUIT's ops a layer over full prefill's: 2 + the scoring pass's ops beyond a layer's own
# over a pass's, for a pass through every layer. A pass is about 38 ops a layer in bf16, and
# on an accelerator's path the scoring pass spends 5 more than a plain layer to form its
# float32 probabilities (keys cast, queries cast and folded for GQA, QK^T with the mask,
# softmax, row sum; 4 in float32); the "read" label refresh adds about one a layer. `conduit`
# comes to 2.15x (whole: 91.9 against 42.8 in bf16; float32 82.5 against 38.6, 2.14x) and
# 2.16x (passes: 83.0 against 38.4; float32 73.8 against 34.2). The default's scoring pass
# stops after 23 of the 28 layers: 1.97x (84.3 against 42.8 in bf16; float32 75.8 against
# 38.6, 1.96x) and 1.97x (passes: 75.5 against 38.4; float32 67.1 against 34.2), within
# issue 65's 2.0 by about 1.4 ops a layer (lab/ttft/NOTES.md). One more op a layer crosses
# each bound.
ISSUE_BOUND = 2.0  # issue 65: the prefill half's ops a layer over full prefill's, bf16
RATIO_BOUND = {
    "conduit_per_page": {"float32": {"whole": 1.98, "passes": 1.98},
                         "bfloat16": {"whole": 1.98, "passes": 1.98}},
    "conduit_focus": {"float32": {"whole": 1.98, "passes": 1.98},  # conduit_per_page's and a
                     "bfloat16": {"whole": 1.98, "passes": 1.98}},  # copy (module docstring)
    "conduit": {"float32": {"whole": 2.15, "passes": 2.17},
                "bfloat16": {"whole": 2.16, "passes": 2.18}},
}
CPU_LOAD_PER_PAGE = 1.0  # the CPU's in-place page load, ops a layer a page

Counts = dict[str, dict[str, list[float]]]  # policy -> "whole" | "passes" | "load" | "cpu_load"


@pytest.fixture(scope="module", params=DTYPES)
def dtype(request: pytest.FixtureRequest) -> str:
    """The narrow model's dtype, each in turn."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def counted(dtype: str) -> Counts:
    """Ops a layer of each policy's prefill half, its passes and its CPU page load, by
    pages."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rt, kvs = narrow_runtime(max(PAGES), dtype=getattr(torch, dtype))
        out: Counts = {}
        for policy in POLICIES:
            rows: dict[str, list[float]] = {"whole": [], "passes": [], "load": [],
                                            "cpu_load": []}
            for pages in PAGES:
                count = count_prefill(rt, kvs[:pages], policy)
                rows["whole"].append(count.ops.total / NARROW_LAYERS)
                rows["load"].append(count.load / NARROW_LAYERS)
                rows["passes"].append(count.passes / NARROW_LAYERS)
                rows["cpu_load"].append(count.cpu_load / NARROW_LAYERS)
            out[policy] = rows
        return out
    finally:
        torch.set_num_threads(saved)


def _flat(counts: list[float]) -> bool:
    return max(counts) <= (1 + FLAT) * min(counts)


@pytest.mark.parametrize("part", ["whole", "passes"])
@pytest.mark.parametrize("policy", POLICIES)
def test_the_prefill_half_does_not_grow_with_pages(counted: Counts, policy: str,
                                                   part: str) -> None:
    counts = counted[policy][part]
    assert _flat(counts), (policy, part, dict(zip(PAGES, counts, strict=True)))


def _ratios(counted: Counts, policy: str, part: str) -> dict[int, float]:
    return {pages: ours / full for pages, ours, full in zip(
        PAGES, counted[policy][part], counted["full_prefill"][part], strict=True)}


@pytest.mark.parametrize("part", ["whole", "passes"])
@pytest.mark.parametrize("policy", list(RATIO_BOUND))
def test_conduit_stays_within_the_bound_of_full_prefill(counted: Counts, dtype: str,
                                                        policy: str, part: str) -> None:
    ratios = _ratios(counted, policy, part)
    assert max(ratios.values()) <= RATIO_BOUND[policy][dtype][part], (policy, part, ratios)


@pytest.mark.parametrize("part", ["whole", "passes"])
def test_the_default_meets_issue_65s_bound(counted: Counts, part: str) -> None:
    ratios = _ratios(counted, DEFAULT_POLICY, part)
    assert max(ratios.values()) <= ISSUE_BOUND, (part, ratios)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_page_load_is_a_fixed_number_of_operations(counted: Counts, policy: str) -> None:
    load = counted[policy]["load"]
    assert min(load) > 0 and len(set(load)) == 1, (policy, dict(zip(PAGES, load, strict=True)))


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cpu_page_load_is_bounded_by_page(counted: Counts, policy: str) -> None:
    load = counted[policy]["cpu_load"]
    assert min(load) > 0, (policy, load)
    for pages, ops in zip(PAGES, load, strict=True):
        assert ops <= CPU_LOAD_PER_PAGE * pages, (policy, pages, ops)
