"""Counting the host reads (device-to-host syncs) of a computation, on any device (issue 65).

On an accelerator every read of a device tensor's values by the host (`.item()`, `int(t)`,
`.cpu()`, `.to("cpu")`, `.numpy()`, `.tolist()`, a boolean mask index, `nonzero`, `unique`,
`bincount`, a `repeat_interleave` by a tensor, a copy into a host tensor) waits for the
device's queue to drain and stops a graph capture. `SyncCounter` counts them on the CPU too,
where nothing would wait, by telling device tensors from host ones as an accelerator would
hold them:

* of the tensors alive when the count is entered, those named in `device` are on the device
  (`runtime_device_tensors`: the model's weights and buffers, the cached heads' and labels'
  K/V, the KV caches alive, such as those the runtime's workspace keeps for the next
  answers), any other on the host (the pages' host copies, the layout's constants);
* inside the count, a tensor is on the device when a factory call was given a `torch.device`
  (`device=adapter.device`), when `.to(device)` / `.cuda()` moved it, or when an operation
  computed it from a device tensor (in-place writes included); any other is on the host
  (host data: a factory call that names no device object, numpy, a `.cpu()` or
  `.to("cpu")`, an operation on host tensors only).

A read of a host tensor is host arithmetic and costs nothing on a device, so it is not
counted; what the passes need on the host must be computed from host data (the layout),
never read back. A factory given a device object is taken for the device whichever device it
names (the CPU cannot tell `rows.device` of a host tensor from the model's device): host code
names the host as `"cpu"`, or names none.

The count may start late and end early: with `start`, a function, it opens at the first
operation dispatched inside `start`; with `end`, it closes at the first operation dispatched
after `end` has run. The prefill's passes run from the first page copy
(`conduit_core.kv.page_loads.load_pages`; the layout is host work before it) to the first
token's logits (`conduit_core.passes.layer_forward.logits_of`; what follows is decode, its one
read the sampled token).

Public API:
  SYNC_OPS: frozenset[str]   aten ops (overload packets) that read a device tensor's values
  runtime_device_tensors(model) -> list[Tensor]   what lives on the device before an answer:
      `model`'s parameters and buffers, every cached head's and label's K/V and states,
      every KV cache's K/V
  SyncCounter(device=(), start=None, end=None)   a context manager (a function mode over a
      dispatch mode): .total, .sites (Counter of "op at file:line", the innermost frame in
      conduit_core), .opened (`start` has run), .closed (the count has ended after `end`)
  count_prefill_syncs(runtime, kvs, policy, budget=0.1) -> SyncCounter   the host reads of
      the TTFT workload's prefill half over `kvs`, from the first page copy to the first
      token's logits, head and labels warm, on its second run (the choice history warm)
  count_step_syncs(runtime, kvs, streams) -> SyncCounter   the host reads of one batched
      decode step of `streams` answers over `kvs` (after their first step)
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.page_loads import load_pages
from conduit_core.label_cache import LabelKV
from conduit_core.page_kv import PageKV
from conduit_core.passes.layer_forward import logits_of
from conduit_core.passes.prompt_head import HeadKV
from conduit_core.runtime import ReuseRuntime
from lab.answering import start_answer, warm_labels
from lab.ttft.op_count import answer_request

SYNC_OPS = frozenset({"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select",
                      "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount"})
_MASK_INDEXED = frozenset({"index", "index_put", "_index_put_impl"})  # synced by a bool index
_READS = frozenset({"cpu", "numpy", "tolist"})  # Tensor methods that hand values to the host


def runtime_device_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors on the device before an answer starts: `model`'s parameters and buffers,
    every cached prompt head's and page label's tensors but the labels' positions (on the
    host by contract, `LabelKV.position_ids`), and every KV cache's (the runtime's workspace
    keeps caches between answers: `conduit_core.kv.workspace`)."""
    out = [*model.parameters(), *model.buffers()]
    for obj in gc.get_objects():
        if type(obj) is HeadKV:
            out += [t for t in vars(obj).values() if isinstance(t, torch.Tensor)]
        elif type(obj) is LabelKV or type(obj) is KVCache:
            out += [obj.keys, obj.values]
    return out


@torch.no_grad()
def count_prefill_syncs(runtime: ReuseRuntime, kvs: list[PageKV], policy: str,
                        budget: float = 0.1) -> SyncCounter:
    """The prefill half's host reads (module docstring), its answer's slot given back."""
    request = answer_request(runtime.vlm, kvs, policy, budget)
    warm_labels(runtime, request.prefix, request.pages)  # no cache miss in the count
    runtime.release(start_answer(runtime, request))
    counter = SyncCounter(device=runtime_device_tensors(runtime.vlm.model), start=load_pages,
                          end=logits_of)
    with counter:
        state = start_answer(runtime, request)
    runtime.release(state)
    return counter


@torch.no_grad()
def count_step_syncs(runtime: ReuseRuntime, kvs: list[PageKV], streams: int) -> SyncCounter:
    """One decode step of `streams` answers over `kvs`: every tensor alive before it is on
    the device (the pool, the answers' rows and tokens), as on an accelerator."""
    request = replace(answer_request(runtime.vlm, kvs, "full_reuse"), max_new_tokens=8)
    states = [start_answer(runtime, request) for _ in range(streams)]
    runtime.step(states)  # the first step takes the pool's slots
    alive = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]
    counter = SyncCounter(device=alive)
    with counter:
        runtime.step(states)
    for state in states:
        runtime.release(state)
    return counter


def _tensors(tree: Any) -> Iterable[torch.Tensor]:
    """The tensors in args/kwargs (lists and tuples flattened one level deep or more)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


def _move_target(args: Any, kwargs: dict[str, Any]) -> str | None:
    """Where `Tensor.to`'s arguments move it: "host" (the string "cpu"), "device" (a device
    object, another name or an index), None (a dtype change only)."""
    given = [kwargs["device"]] if kwargs.get("device") is not None else [
        a for a in args[1:] if isinstance(a, (torch.device, str, int)) and not isinstance(a, bool)]
    if not given:
        return None
    return "host" if isinstance(given[0], str) and given[0].startswith("cpu") else "device"


def _site(frame: FrameType | None) -> str:
    """The innermost frame in conduit_core as file:line (or the caller's, outside it)."""
    first = None
    while frame is not None:
        name = frame.f_code.co_filename
        if first is None and name != __file__ and "/torch/" not in name:
            first = f"{name}:{frame.f_lineno}"
        if "conduit_core" in name:
            return f"{name.split('conduit_core/')[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return first or "?"


class SyncCounter:
    """Counts host reads of device tensors inside the block (module docstring)."""

    def __init__(self, device: Iterable[torch.Tensor] = (),
                 start: Callable[..., Any] | None = None,
                 end: Callable[..., Any] | None = None) -> None:
        self.sites: Counter[str] = Counter()
        self.opened, self.closed = start is None, False
        self._device: dict[int, weakref.ref[torch.Tensor]] = {}
        self._start = None if start is None else start.__code__
        self._end = None if end is None else end.__code__
        self._ended = False  # `end` has dispatched an operation
        for t in device:
            self._mark(t, host=False)
        counter = self

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                return counter._function(func, args, kwargs or {})

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                return counter._dispatch(func, args, kwargs or {})

        self._modes = (_Functions(), _Dispatch())

    @property
    def total(self) -> int:
        """Host reads counted."""
        return sum(self.sites.values())

    # ---- which tensors are on the host --------------------------------------------------
    def _is_host(self, t: torch.Tensor) -> bool:
        ref = self._device.get(id(t))
        return ref is None or ref() is not t

    def _mark(self, t: torch.Tensor, host: bool) -> None:
        key = id(t)
        if host:
            self._device.pop(key, None)
        else:
            self._device[key] = weakref.ref(t, partial(self._forget, key))

    def _forget(self, key: int, _: object) -> None:
        """A device tensor was freed: its id may name another tensor next."""
        self._device.pop(key, None)

    # ---- the count ----------------------------------------------------------------------
    @staticmethod
    def _inside(code: Any) -> bool:
        frame: FrameType | None = sys._getframe(3)
        while frame is not None:
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def _tick(self) -> None:
        """Open the count at the first operation inside `start`, close it at the first
        operation after `end` has run."""
        if not self.opened:
            self.opened = self._inside(self._start)
        if self._end is None or self.closed or not self.opened:
            return
        if self._inside(self._end):
            self._ended = True
        elif self._ended:
            self.closed = True

    def _read(self, what: str) -> None:
        if self.opened and not self.closed:
            self.sites[f"{what} at {_site(sys._getframe(2))}"] += 1

    def _function(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        name = getattr(func, "__name__", "")
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        target = _move_target(args, kwargs) if name == "to" and source is not None else None
        if source is not None and (name in _READS or target == "host"):
            self._tick()
            if not self._is_host(source):
                self._read("to cpu" if target else name)
        out = func(*args, **kwargs)
        if not any(True for _ in _tensors((args, kwargs))):  # a factory: host data, unless
            for t in _tensors(out):  # it names a device object (a string names the host)
                self._mark(t, host=not isinstance(kwargs.get("device"), torch.device))
            return out
        if source is not None and isinstance(out, torch.Tensor):
            if name in ("cpu", "cuda") or target is not None:
                if out is source:  # the CPU returns the tensor itself: a new one stands
                    out = source.view_as(source)  # for the copy the device would make
                self._mark(out, host=name == "cpu" or target == "host")
        return out

    def _dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        self._tick()
        name = func.overloadpacket.__name__
        inputs = list(_tensors((args, kwargs)))
        on_host = all(self._is_host(t) for t in inputs)
        if not on_host and self._syncs(name, func, args, kwargs):
            self._read(name)
        out = func(*args, **kwargs)
        if name == "copy_" and len(args) > 1 and self._is_host(args[0]) \
                and not self._is_host(args[1]):
            self._read("copy to host")  # the destination stays a host tensor
            return out
        for t in _tensors(out):
            self._mark(t, host=on_host)
        return out

    @staticmethod
    def _syncs(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
        if name in SYNC_OPS:
            return True
        if name in _MASK_INDEXED and len(args) > 1:
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                       for i in args[1] if i is not None)
        if name == "repeat_interleave":  # by a tensor: the output's size is read unless given
            return func._overloadname == "Tensor" and kwargs.get("output_size") is None
        return False

    def __enter__(self) -> SyncCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(kind, exc, tb)
