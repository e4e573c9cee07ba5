"""The pooled decode step captured once per batch-size bucket (CUDA graphs) or compiled once
per bucket (`torch.compile`, inductor, fullgraph), ahead of the first question.

A step of n pooled answers (slots 0..n-1, every occupied slot) runs in the smallest prepared
bucket b >= n: its token ids, cache rows and positions are copied into the bucket's static
device tensors (rows b - n.. pad, `pooled_step`), and the bucket's step runs over the pool's
fixed tensors (`DecodePool(fixed=True)`), attending over the whole slot capacity under a mask
(`pooled_step.pooled_forward`, span = capacity): one kernel sequence per bucket, whatever
the answers' lengths. The host's part of a step is two copies (the token ids, device to
device; rows and positions from a pinned host buffer, asynchronous) and one replay; nothing
is read back, so the step's one host sync stays each answer's token id (`DecodeState.pick`).
Steps no bucket covers (an answer on its own cache, a step that leaves a slot out, a bucket
not prepared in time) run `batch_forward.forward_step` eagerly.

Kinds (`kind_for(mode, device)`): "graph" (CUDA: `torch.cuda.CUDAGraph`, captured by hand
on a side stream after two warm-up runs, all buckets sharing one memory pool), "compile"
(`torch.compile(fullgraph=True, dynamic=False)`: one graph per bucket, no graph break),
"eager" (none: every step takes `forward_step`). Modes: "off" -> eager; "on" -> graph on
CUDA, compile elsewhere; "auto" -> graph on CUDA, eager elsewhere (on the CPU the compiled
step attends over the whole slot, which made it the slower one: lab/ttft/NOTES.md).

Public API:
  DECODE_COMPILE_MODES = ("auto", "off", "on")
  kind_for(mode, device) -> "graph" | "compile" | "eager"
  buckets(max_slots) -> [1, 2, 4, ..., max_slots]
  StepGraphs(adapter, pool, mode, sizes=None)   `pool` must be fixed unless the kind is
      eager; `sizes`: the buckets' batch sizes (default `buckets(pool.max_slots)`), each at
      most `pool.max_slots`
    .kind, .ready (prepared bucket sizes), .replays (steps run in a bucket so far)
    .prepare(budget_s) -> str   allocate the pool and capture/compile the buckets in turn
        until the budget is spent (a bucket started is finished); the pool must be empty
        (the warm-up runs write row 0 of free slots); returns a line for the log
    .covers(rows) -> bool       whether a step of these rows runs in a prepared bucket
    .step(rows, tokens: n 0-d device tensors) -> logits (n, vocab) float32 in the rows'
        order (a copy: the next step may overwrite the bucket's output)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from conduit_core.kv.kv_pool import DecodePool
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.batch_forward import StepRow
from conduit_core.passes.pooled_step import pooled_forward

DECODE_COMPILE_MODES = ("auto", "off", "on")


def kind_for(mode: str, device: torch.device | str) -> str:
    """How a decode step is prepared for `mode` on `device` (module docstring)."""
    if mode not in DECODE_COMPILE_MODES:
        raise ValueError(f"decode compile mode must be one of {DECODE_COMPILE_MODES}, "
                         f"got {mode!r}")
    cuda = torch.device(device).type == "cuda"
    if mode == "off":
        return "eager"
    if cuda:
        return "graph"
    return "compile" if mode == "on" else "eager"


def buckets(max_slots: int) -> list[int]:
    """Batch sizes prepared: powers of two below `max_slots`, then `max_slots`."""
    out, b = [], 1
    while b < max_slots:
        out.append(b)
        b *= 2
    return [*out, max_slots]


@dataclass
class _Bucket:
    """One batch size's static inputs and its prepared step."""

    tokens: torch.Tensor  # (b,) int64 on the device
    meta: torch.Tensor  # (2, b) int64 on the device: cache rows, positions
    host: torch.Tensor  # (2, b) int64 on the host (pinned on CUDA): staged rows, positions
    run: Callable[[], torch.Tensor]  # the step over the static inputs -> logits (b, vocab)


class StepGraphs:
    """The prepared decode step of one runtime's pool (see the module docstring)."""

    def __init__(self, adapter: VLMAdapter, pool: DecodePool, mode: str = "auto",
                 sizes: list[int] | None = None):
        self.adapter = adapter
        self.pool = pool
        self.kind = kind_for(mode, adapter.device)
        if self.kind != "eager" and not pool.fixed:
            raise ValueError("a captured or compiled decode step needs a fixed pool")
        self.sizes = sorted(sizes) if sizes is not None else buckets(pool.max_slots)
        if not self.sizes or self.sizes[0] < 1 or self.sizes[-1] > pool.max_slots:
            raise ValueError(f"bucket sizes must lie in 1..{pool.max_slots}")
        self.replays = 0
        self._buckets: dict[int, _Bucket] = {}
        self._graph_pool: Any = None

    @property
    def ready(self) -> list[int]:
        """Bucket sizes prepared so far."""
        return sorted(self._buckets)

    def prepare(self, budget_s: float) -> str:
        """Capture or compile every bucket in turn within `budget_s` (module docstring)."""
        if self.kind == "eager":
            return "decode step: eager (no capture)"
        if self.pool.size:
            raise RuntimeError("prepare the decode step before any answer takes a slot")
        self.pool.allocate()
        start = time.perf_counter()
        for b in self.sizes:
            if b in self._buckets:
                continue
            if time.perf_counter() - start > budget_s:
                break
            self._buckets[b] = self._build(b)
        took = time.perf_counter() - start
        left = [b for b in self.sizes if b not in self._buckets]
        return (f"decode step: {self.kind} for batch sizes {self.ready} in {took:.1f} s"
                f" (budget {budget_s:.0f} s)"
                + (f"; batch sizes {left} run eager (budget spent)" if left else ""))

    def _build(self, b: int) -> _Bucket:
        pool = self.pool
        assert pool.keys is not None and pool.values is not None
        keys, values, span = pool.keys, pool.values, int(pool.keys.shape[3])
        dev = self.adapter.device
        tokens = torch.zeros(b, dtype=torch.long, device=dev)  # (b,)
        meta = torch.zeros((2, b), dtype=torch.long, device=dev)  # (2, b)
        host = torch.zeros((2, b), dtype=torch.long, pin_memory=dev.type == "cuda")
        adapter = self.adapter

        def eager() -> torch.Tensor:
            return pooled_forward(adapter, keys, values, tokens, meta[0], meta[1], span)

        if self.kind == "compile":
            compiled = torch.compile(pooled_forward, fullgraph=True, dynamic=False)

            def run() -> torch.Tensor:
                out: torch.Tensor = compiled(adapter, keys, values, tokens, meta[0], meta[1],
                                             span)
                return out

            run()  # compiles now, writing row 0 of free slots
            return _Bucket(tokens, meta, host, run)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisations (cuBLAS workspaces) before capture
                eager()
        torch.cuda.current_stream(dev).wait_stream(side)
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            static_out = eager()  # (b, vocab)

        def replay() -> torch.Tensor:
            graph.replay()
            return static_out

        return _Bucket(tokens, meta, host, replay)

    def _bucket_for(self, n: int) -> _Bucket | None:
        for b in self.ready:
            if b >= n:
                return self._buckets[b]
        return None

    def covers(self, rows: list[StepRow]) -> bool:
        """Whether `rows` are every occupied slot (in any order) and a bucket holds them."""
        n = len(rows)
        return (bool(self._buckets) and n == self.pool.size
                and sorted(r.slot if r.slot is not None else -1 for r in rows) == list(range(n))
                and self._bucket_for(n) is not None)

    def step(self, rows: list[StepRow], tokens: list[torch.Tensor]) -> torch.Tensor:
        """Logits (n, vocab), in the order of `rows`, of one step of the pooled `rows`, whose
        token ids are `tokens` (n 0-d tensors on the device), in the smallest prepared bucket
        that holds them."""
        n = len(rows)
        bucket = self._bucket_for(n)
        assert bucket is not None, "covers() first"
        by_slot = sorted(range(n), key=lambda i: rows[i].slot or 0)
        pad = [0] * (int(bucket.tokens.shape[0]) - n)
        bucket.host.copy_(torch.tensor([[rows[i].n_keys - 1 for i in by_slot] + pad,
                                        [rows[i].position_id for i in by_slot] + pad]))
        bucket.meta.copy_(bucket.host, non_blocking=True)  # (2, b)
        bucket.tokens[:n].copy_(torch.stack([tokens[i] for i in by_slot]))  # (n,)
        out = bucket.run()  # (b, vocab), row j = slot j
        self.replays += 1
        if by_slot == list(range(n)):
            return out[:n].clone()
        return torch.stack([out[r.slot or 0] for r in rows])  # (n, vocab)
