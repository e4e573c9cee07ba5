"""Counting the aten operations that launch work, on the narrow 28-layer model (issue 58).

Host cost on a GPU follows the number of kernels a pass issues, not its FLOPs. This module
counts them on any device: a `TorchDispatchMode` sees every aten operation a computation
dispatches (after PyTorch's own decompositions), and counts those that launch work. Views and
metadata-only operations are not counted (`LAUNCH_FREE`, the one list: they return a new
view of the same storage, or a size, and launch nothing); allocations (`empty` and kin) are
not counted either (they take memory from the caching allocator and launch nothing).
Everything else counts once a call, in-place forms included (`mul_` is `mul`).

The counts stand for a device's launches, so they are taken on an accelerator's path
(`accelerator_path`), where the CPU trades operations for memory passes: a masked row subset
attends in one sdpa call a layer (the CPU takes four, to read fewer keys:
`conduit_core.passes.row_attention.ROW_GROUPS`), pages load joined in one buffer (the CPU turns
each page in place: `conduit_core.kv.page_loads.PAGE_BY_PAGE`), keys re-rotate in steps of
an accelerator's size (the CPU's stay in its cache: `rotation.ROTATE_CHUNK_ELEMENTS`) and the
scoring pass's layers compute their attention output in their own sdpa call (the CPU's take it
from the scoring probabilities: `conduit_core.passes.stale_pass.FUSED_SCORES`).

The model is a random-weight Qwen2.5-VL with Qwen2.5-VL-7B's 28 decoder layers at hidden 64
(`narrow_vlm`): per-layer overhead, not arithmetic, is what it measures, so the narrow width
makes the count fast while keeping the depth that multiplies it.

Public API:
  LAUNCH_FREE: frozenset[str]   aten op names (overload packets) that are not counted
  op_name(func) -> str          an aten op's name as counted (`mul_` is `mul`)
  OpCounter()                   a TorchDispatchMode: .total, .by_name (Counter), .reset()
  count_ops(fn) -> (fn's result, OpCounter)
  NARROW_LAYERS = 28, NARROW_SHAPE   the narrow model's shape (`lab.ttft.model.ModelShape`)
  narrow_vlm(tokens_per_page=256, layers=NARROW_LAYERS, dtype=float32) -> LoadedVLM
  answer_request(vlm, kvs, policy, budget=0.1, question_tokens=32) -> AnswerRequest
      (policy: a registered name or a `PolicyChoice`)
  PhaseCounting()   a `PassObserver` (`conduit_core.pass_observer`): the ops of the runtime's
      passes alone (`.passes`: scoring pass, refresh, first-token logits) and of its page
      loads (`.load`), counted while it observes the runtime (`lab.answering.observing`)
  prefill_ops(runtime, request) -> OpCounter   the prefill half of an answer (assembly,
      scoring pass, refresh, first-token logits: `lab.answering.start_answer`), decode
      excluded
  ops_per_layer(counter, layers) -> float
  narrow_runtime(pages, tokens_per_page=256, dtype=float32) -> (ReuseRuntime, list[PageKV])
      the narrow model's runtime and `pages` cached bench pages (the one setup of the bench
      and the tests)
  accelerator_path()   a context: the CPU takes an accelerator's path (module docstring)
  count_prefill(runtime, kvs, policy, budget=0.1) -> PrefillCount   the prefill half over
      cached pages `kvs`, head and labels warm, counted on its second run (the choice
      history warm, as in service) on the accelerator's path: .ops (OpCounter), .passes,
      .load; and .cpu_load, the page load's ops on the CPU's own path
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.kv.page_loads import PAGE_BY_PAGE
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.pass_observer import Phase
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.row_attention import ROW_GROUPS
from conduit_core.passes.stale_pass import FUSED_SCORES
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import PolicyChoice
from conduit_core.prompt.rotation import ROTATE_CHUNK_ELEMENTS
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.answering import observing
from lab.ttft.model import SHAPES, bench_pages, build_bench_vlm, make_workload

T = TypeVar("T")

LAUNCH_FREE = frozenset({
    # views and metadata-only operations (issue 58's list, and the aliases aten uses for them)
    "view", "reshape", "_reshape_alias", "_unsafe_view", "slice", "select", "narrow", "split",
    "split_with_sizes", "unbind", "expand", "as_strided", "squeeze", "unsqueeze", "t",
    "transpose", "permute", "detach", "alias", "lift_fresh",
    # queries of sizes and identity: no computation
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
    # allocations: memory from the allocator, no kernel
    "empty", "empty_strided", "empty_like",
})

NARROW_LAYERS = 28
NARROW_SHAPE = replace(SHAPES["tiny"], text={**SHAPES["tiny"].text,
                                              "num_hidden_layers": NARROW_LAYERS},
                       notes="Qwen2.5-VL-7B's depth at hidden 64 (op counts)")


def op_name(func: Any) -> str:
    """An op's overload-packet name with any in-place underscore dropped (`mul_` -> `mul`;
    `_unsafe_view` keeps its leading one)."""
    name: str = func.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


class OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched inside it that launch work (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Counted operations."""
        return sum(self.by_name.values())

    def reset(self) -> None:
        """Forget what was counted."""
        self.by_name.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        name = op_name(func)
        if name not in LAUNCH_FREE:
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))


class PhaseCounting:
    """A `PassObserver` that counts the operations of the runtime's passes alone into
    `.passes` (scoring pass, refresh, first-token logits: the layer path, without the
    assembly, the page labels, the plan and the selection around it) and those of its page
    loads into `.load`."""

    def __init__(self) -> None:
        self.passes = OpCounter()
        self.load = OpCounter()

    def phase(self, name: Phase, assembly: Assembly) -> AbstractContextManager[object]:
        """The counter phase `name` runs in."""
        return self.load if name == "page_load" else self.passes

    def reset(self) -> None:
        """Forget what was counted."""
        self.passes.reset()
        self.load.reset()


def count_ops(fn: Callable[[], T]) -> tuple[T, OpCounter]:
    """Run `fn()` under an `OpCounter`; its result and the counter."""
    counter = OpCounter()
    with counter:
        out = fn()
    return out, counter


def ops_per_layer(counter: OpCounter, layers: int) -> float:
    """Counted operations over the model's decoder layers."""
    return counter.total / layers


def narrow_vlm(tokens_per_page: int = 256, layers: int = NARROW_LAYERS,
               dtype: torch.dtype = torch.float32) -> LoadedVLM:
    """The narrow random-weight Qwen2.5-VL (CPU, sdpa) in `dtype`, pages of
    `tokens_per_page` merged visual tokens."""
    spec = replace(NARROW_SHAPE, text={**NARROW_SHAPE.text, "num_hidden_layers": layers})
    return build_bench_vlm(f"narrow{layers}", tokens_per_page=tokens_per_page, spec=spec,
                           dtype=dtype)


def answer_request(vlm: LoadedVLM, kvs: list[PageKV], policy: str | PolicyChoice,
                   budget: float = 0.1, question_tokens: int = 32) -> AnswerRequest:
    """The TTFT workload's request over cached pages `kvs` (one token to generate) under
    `policy`, a registered name (its own options) or a chosen policy."""
    work = make_workload(vlm, len(kvs), question_tokens)
    pages = [PageInput(label, kv) for label, kv in zip(work.labels, kvs, strict=True)]
    chosen = policy if isinstance(policy, PolicyChoice) else choose_policy(policy)
    return AnswerRequest(work.prefix, pages, work.question, policy=chosen, budget=budget,
                         max_new_tokens=1)


@torch.no_grad()
def prefill_ops(runtime: ReuseRuntime, request: AnswerRequest) -> OpCounter:
    """Operations of the prefill half of `request` on `runtime` (its head and labels must be
    warm: `lab.answering.warm_labels`, so that no cache miss is counted); the answer's pool
    slot is given back."""
    counter = OpCounter()
    with counter:
        state = answering.start_answer(runtime, request)
    runtime.release(state)
    return counter


def narrow_runtime(pages: int, tokens_per_page: int = 256,
                   dtype: torch.dtype = torch.float32) -> tuple[ReuseRuntime, list[PageKV]]:
    """A runtime over `narrow_vlm(tokens_per_page, dtype=dtype)` and `pages` bench pages
    prefilled on it (`lab.ttft.model.bench_pages`); the caller pins the threads."""
    runtime = ReuseRuntime(narrow_vlm(tokens_per_page, dtype=dtype))
    return runtime, runtime.prefill_pages(bench_pages(pages, tokens_per_page))


@dataclass(frozen=True)
class PrefillCount:
    """The operations of one prefill half on the accelerator's path: all of them (`ops`),
    those of its passes alone (`passes`) and of its page load (`load`); and the page load's
    on the CPU's own path (`cpu_load`)."""

    request: AnswerRequest
    ops: OpCounter
    passes: int
    load: int
    cpu_load: int


@contextmanager
def accelerator_path() -> Iterator[None]:
    """Within the block the CPU takes an accelerator's path (module docstring): the
    per-device settings `ROW_GROUPS`, `PAGE_BY_PAGE`, `ROTATE_CHUNK_ELEMENTS` and
    `FUSED_SCORES` emptied, and restored after."""
    saved = dict(ROW_GROUPS), set(PAGE_BY_PAGE), dict(ROTATE_CHUNK_ELEMENTS), set(FUSED_SCORES)
    ROW_GROUPS.clear()
    PAGE_BY_PAGE.clear()
    ROTATE_CHUNK_ELEMENTS.clear()
    FUSED_SCORES.clear()
    try:
        yield
    finally:
        ROW_GROUPS.update(saved[0])
        PAGE_BY_PAGE.update(saved[1])
        ROTATE_CHUNK_ELEMENTS.update(saved[2])
        FUSED_SCORES.update(saved[3])


@torch.no_grad()
def count_prefill(runtime: ReuseRuntime, kvs: list[PageKV], policy: str | PolicyChoice,
                  budget: float = 0.1) -> PrefillCount:
    """The prefill half of the TTFT workload's request over `kvs` under `policy`: head and
    labels computed ahead, one run to warm the choice history (as in service), then the
    counted run, on the accelerator's path (`accelerator_path`), its passes and page load
    counted apart through the runtime's observer (`PhaseCounting`); then the page load's
    ops on the CPU's own path."""
    request = answer_request(runtime.vlm, kvs, policy, budget)
    answering.warm_labels(runtime, request.prefix, request.pages)  # no miss is counted
    phases = PhaseCounting()
    with observing(runtime, phases):
        with accelerator_path():
            prefill_ops(runtime, request)
            phases.reset()
            ops = prefill_ops(runtime, request)
        passes, load = phases.passes.total, phases.load.total
        phases.reset()
        prefill_ops(runtime, request)
    return PrefillCount(request, ops, passes, load, phases.load.total)
