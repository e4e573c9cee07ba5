"""No host read inside an answer's passes but the default's one; one in a batched decode step
(issues 65, point 1, and 67).

Counted by `lab.ttft.host_syncs.SyncCounter` (a dispatch mode under a function mode: `.item()`,
`int()`, `.cpu()`, `.numpy()`, `.tolist()`, boolean-mask indexing, `nonzero`, `unique`,
`bincount` of a tensor that would live on the device) on the narrow random-weight
Qwen2.5-VL (28 layers, 256-token pages) on the accelerator's path
(`lab.ttft.op_count.accelerator_path`), set up as the op counts are:
* the prefill half from the first page copy to the first token's logits reads nothing back,
  for the paper's `conduit`, `conduit_per_page`, `full_reuse` and a full prefill from the
  cached pages, at 2, 8 and 32 pages (the layout's host numbers are computed before the first
  page copy; the choice the device makes stays there until the first token);
* `conduit_focus` reads one thing back there, in its own module: the visual
  tokens' scores, from which the host decides how many to refresh (docs/DECISIONS.md, "The
  answer's passes read nothing back...");
* a batched decode step of 1, 4 and 16 streams reads one thing back (the new token ids).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lab.ttft.host_syncs import SyncCounter, count_prefill_syncs, count_step_syncs
from lab.ttft.op_count import accelerator_path, narrow_runtime

PAGES = (2, 8, 32)
POLICIES = ("conduit", "conduit_per_page", "full_reuse", "full_prefill")
STREAMS = (1, 4, 16)


@pytest.fixture(scope="module")
def narrow() -> Iterator[tuple]:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield narrow_runtime(max(PAGES))
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("pages", PAGES)
@pytest.mark.parametrize("policy", POLICIES)
def test_the_passes_read_nothing_back(narrow: tuple, policy: str, pages: int) -> None:
    runtime, kvs = narrow
    with accelerator_path():
        counter = count_prefill_syncs(runtime, kvs[:pages], policy)
    assert counter.opened and counter.closed  # the window ran from page copy to logits
    assert counter.total == 0, dict(counter.sites)


@pytest.mark.parametrize("pages", PAGES)
def test_the_default_reads_its_scores_once(narrow: tuple, pages: int) -> None:
    runtime, kvs = narrow
    with accelerator_path():
        counter = count_prefill_syncs(runtime, kvs[:pages], "conduit_focus")
    assert counter.opened and counter.closed
    assert counter.total == 1, dict(counter.sites)
    assert all("conduit_focus.py" in site for site in counter.sites), dict(counter.sites)


@pytest.mark.parametrize("streams", STREAMS)
def test_a_decode_step_reads_back_once(narrow: tuple, streams: int) -> None:
    runtime, kvs = narrow
    with accelerator_path():
        counter = count_step_syncs(runtime, kvs[:2], streams)
    assert counter.total <= 1, dict(counter.sites)


def test_a_read_of_the_device_choice_is_counted(narrow: tuple) -> None:
    """The counter itself: a choice made on the device and read back counts; the same read
    of host data does not."""
    runtime, _ = narrow
    weight = next(runtime.vlm.model.parameters())
    with SyncCounter(device=[weight]) as counter:
        host = torch.arange(4)
        host.tolist(), int(host[0]), host[host > 1]  # host arithmetic: free
        chosen = torch.topk(weight.flatten()[:8], 2).indices
        chosen.cpu()  # a read of the device's choice
        chosen.to("cpu")
        int(chosen[0])
        chosen.to(weight.device)  # a move on the device: free
    assert counter.total == 3, dict(counter.sites)
