"""Where the prefill half's operations come from: each counted aten operation with its Python
call site, and whether it runs on device tensors or host ones (issue 65).

`python -m lab.ttft.op_sites [--policy conduit_focus] --pages 8 [--dtype bfloat16]
[--compiled]` prints, for the TTFT workload's prefill half on the narrow model on an
accelerator's path (counted as `lab.ttft.op_count.count_prefill` counts it, on a run after
one that warms the choice history), one line per (call site, operation): how many times it
ran, a layer, and where. A call site is the innermost frames in `conduit_core` or in the
model's own modules (three of them, innermost first). An operation "body" runs inside a layer
of a pass (a forward's layer loop and what it calls, the scoring pass's layer observer);
"around" is everything else: layout, page load, plan, selection, row setups, masks, padding,
first-token logits.

Eager (the default): each operation is tagged "device" or "host" as `lab.ttft.host_syncs`
tells device tensors from host ones (an operation on host tensors only is host arithmetic:
it launches nothing on an accelerator, though it costs the host its dispatch). Compiled
(`--compiled`): the layer bodies compiled by inductor, as `lab.ttft.compiled_counts` counts
them; the lines are the operations run eagerly around the compiled bodies (no host tag:
dynamo runs no compiled code under the function mode that tags them).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch

from conduit_core.policies.choice import DEFAULT_POLICY
from lab import answering
from lab.ttft.compiled_counts import LaunchCounter, _in_compiled_code
from lab.ttft.host_syncs import SyncCounter, _tensors, runtime_device_tensors
from lab.ttft.op_count import (
    LAUNCH_FREE,
    NARROW_LAYERS,
    accelerator_path,
    answer_request,
    narrow_runtime,
    op_name,
)

BODY = frozenset({"forward_rows_steps", "_output_rows", "observe", "_forward_compiled"})
LOOPS = frozenset({"forward_rows_steps", "_forward_compiled"})  # body inside their layer loop
OWN = ("/conduit_core/", "/transformers/models/")  # frames a call site names
DEPTH = 3  # frames a call site names


def call_site(frame: FrameType | None) -> tuple[str, str]:
    """The call site of an operation dispatched under `frame` (module docstring) and
    "body" or "around"."""
    names: list[str] = []
    part = "around"
    while frame is not None:
        path = frame.f_code.co_filename
        if any(own in path for own in OWN):
            short = path.split("site-packages/")[-1].split("/main/")[-1]
            if len(names) < DEPTH:
                names.append(f"{short}:{frame.f_lineno} {frame.f_code.co_name}")
            if frame.f_code.co_name in BODY and path.endswith(("layer_forward.py",
                                                                 "stale_pass.py")):
                body = frame.f_code.co_name not in LOOPS or _in_loop(frame)
                part = "body" if body else part
                if body:
                    break
        frame = frame.f_back
    return " < ".join(names), part


def _in_loop(frame: FrameType) -> bool:
    """Whether a forward is inside its layer loop (past its setup and padding)."""
    return frame.f_locals.get("li") is not None


class SiteCounter(SyncCounter):
    """A `SyncCounter` that also records each launching operation's call site, part and
    whether it ran on host tensors only (`.ops`: Counter of (site, part, op, where))."""

    def __init__(self, device: list[torch.Tensor]) -> None:
        super().__init__(device=device)
        self.ops: Counter[tuple[str, str, str, str]] = Counter()
        self._factory_device: bool | None = None

    def _function(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        factory = not any(True for _ in _tensors((args, kwargs)))
        saved = self._factory_device
        self._factory_device = (isinstance(kwargs.get("device"), torch.device)
                                if factory else None)
        try:
            return super()._function(func, args, kwargs)
        finally:
            self._factory_device = saved

    def _dispatch(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        name = op_name(func)
        if name not in LAUNCH_FREE:
            inputs = list(_tensors((args, kwargs)))
            host = (all(self._is_host(t) for t in inputs) if inputs
                    else not self._factory_device)
            site, part = call_site(sys._getframe(2))
            self.ops[(site, part, name, "host" if host else "device")] += 1
        return super()._dispatch(func, args, kwargs)


class CompiledSites(LaunchCounter):
    """A `LaunchCounter` that records each eager operation's call site and part (`.ops`:
    Counter of (site, part, op, "-"))."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[tuple[str, str, str, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        frame = sys._getframe(1)
        name = op_name(func)
        if name not in LAUNCH_FREE and not _in_compiled_code(frame):
            site, part = call_site(frame)
            self.ops[(site, part, name, "-")] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


@torch.no_grad()
def op_sites(policy: str, pages: int, dtype: torch.dtype,
             compiled: bool) -> Counter[tuple[str, str, str, str]]:
    """The prefill half's operations by (site, part, op, device|host|-) (module docstring)."""
    from conduit_core.passes.layer_graphs import compile_layers

    rt, kvs = narrow_runtime(pages, dtype=dtype)
    request = answer_request(rt.vlm, kvs, policy)
    answering.warm_labels(rt, request.prefix, request.pages)

    def run() -> None:
        rt.release(answering.start_answer(rt, request))

    if compiled:
        compile_layers(rt.adapter, "on", backend="inductor")
    try:
        with accelerator_path():
            run()
            run()
            counter: SiteCounter | CompiledSites = (
                CompiledSites() if compiled
                else SiteCounter(runtime_device_tensors(rt.vlm.model)))
            with counter:
                run()
        return counter.ops
    finally:
        compile_layers(rt.adapter, "off")


def main(argv: list[str] | None = None) -> None:
    """Print the listing (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--part", choices=("all", "around", "body"), default="around")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ops = op_sites(args.policy, args.pages, getattr(torch, args.dtype), args.compiled)
    totals: Counter[tuple[str, str]] = Counter()
    for (_, part, _, where), n in ops.items():
        totals[(part, where)] += n
    print(f"# {args.policy}, {args.pages} pages, {args.dtype}, "
          f"{'compiled' if args.compiled else 'eager'}: ops a layer by part and tensors: "
          + ", ".join(f"{p}/{w} {n / NARROW_LAYERS:.2f}" for (p, w), n in sorted(totals.items())))
    for (site, part, name, where), n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        if args.part in ("all", part):
            print(f"{n:5d} {n / NARROW_LAYERS:5.2f} {part:6s} {where:6s} {name:24s} {site}")


if __name__ == "__main__":
    main()
