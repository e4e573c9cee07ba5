"""The pooled decode step captured once per bucket (CUDA graphs) or compiled once per bucket
(`torch.compile`, inductor, fullgraph), ahead of the first question.

The pool's slots lie in tiers (`kv_pool.SlotTier`: a short tier and a longer one by default),
and each tier's answers run in a bucket of that tier. A bucket is a tier, a batch size b and a
span s: a step of a tier's n pooled answers (its slots 0..n-1, every occupied slot) whose
longest attends to m keys runs in the tier's prepared bucket of the smallest b >= n and,
among those, the smallest s >= m. Its token ids, cache rows and positions are copied into
the bucket's static device tensors (rows b - n.. pad, `pooled_step`), and the bucket's step
runs over the tier's fixed tensors (`DecodePool(fixed=True)`), attending over the first s
positions of each slot under a mask (`pooled_step.pooled_forward`): attention reads the used
length rounded up to a span bucket (`span_buckets`: the tier's slot capacity and its halves),
not the slot's capacity. The host's part of a tier's step is two copies (the token ids,
device to device; rows and positions from a pinned host buffer, asynchronous) and one replay;
nothing is read back, so the step's one host sync stays the batch's token ids. A bucket's
output is copied out, since the next step overwrites it.

Buckets are prepared before the first question, within a time budget: every tier's batch
sizes at its full span first, then the smaller spans, a bucket once started always finished,
on an empty pool (the warm-up runs write row 0 of free slots). An answer that outgrows its
slot moves to a slot of the next tier before the step (`DecodePool.move`) and runs in that
tier's buckets from then on: the others stay in theirs, and nothing is compiled or captured
after `prepare`. An answer no tier holds decodes from its own cache: it runs its own part of
the step eagerly (`batch_forward.forward_step`) beside the pooled answers. A tier's step that
no bucket covers (a step that leaves one of its occupied slots out, a bucket not prepared in
time) runs eagerly too, the other tiers' in their buckets.

Kinds (`kind_for(mode, device)`): "graph" (CUDA: `torch.cuda.CUDAGraph`, captured by hand
on a side stream after two warm-up runs, all buckets sharing one memory pool), "compile"
(`torch.compile(fullgraph=True, dynamic=False)`: one graph per bucket, no graph break),
"eager" (none: every step takes `forward_step`). Modes: "off" -> eager; "on" -> graph on
CUDA, compile elsewhere; "auto" -> graph on CUDA, eager elsewhere (lab/ttft/NOTES.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from conduit_core.kv.kv_pool import POSITION_STEP, DecodePool
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.batch_forward import StepRow
from conduit_core.passes.pooled_step import pooled_forward

DECODE_COMPILE_MODES = ("auto", "off", "on")
SPAN_BUCKETS = 4  # spans a batch size is prepared for: the slot capacity and its halves


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


def span_buckets(capacity: int, count: int = SPAN_BUCKETS) -> list[int]:
    """Spans prepared, ascending: `capacity` and up to `count - 1` of its halves, each of at
    least `POSITION_STEP` positions."""
    out = [capacity]
    while len(out) < count and out[-1] // 2 >= POSITION_STEP:
        out.append(out[-1] // 2)
    return out[::-1]


@dataclass
class _Bucket:
    """One bucket's static inputs and its prepared step."""

    tokens: torch.Tensor  # (b,) int64 on the device
    meta: torch.Tensor  # (2, b) int64 on the device: cache rows, positions
    host: torch.Tensor  # (2, b) int64 on the host (pinned on CUDA): staged rows, positions
    run: Callable[[], torch.Tensor]  # the step over the static inputs -> logits (b, vocab)


class StepGraphs:
    """The prepared decode step of one runtime's pool (see the module docstring)."""

    def __init__(self, adapter: VLMAdapter, pool: DecodePool, mode: str = "auto",
                 sizes: list[list[int]] | None = None, spans: list[list[int]] | None = None):
        """`sizes` and `spans`: each tier's batch sizes and spans (default: `buckets` of its
        slots, `span_buckets` of its capacity)."""
        self.adapter = adapter
        self.pool = pool
        self.kind = kind_for(mode, adapter.device)
        if self.kind != "eager" and not pool.fixed:
            raise ValueError("a captured or compiled decode step needs a fixed pool")
        self.plans: list[tuple[list[int], list[int]]] = []  # per tier: batch sizes, spans
        for t, tier in enumerate(pool.tiers if self.kind != "eager" else []):
            assert tier.capacity is not None
            size = sorted(sizes[t]) if sizes is not None else buckets(tier.max_slots)
            span = sorted(spans[t]) if spans is not None else span_buckets(tier.capacity)
            if not size or size[0] < 1 or size[-1] > tier.max_slots:
                raise ValueError(f"tier {t}'s bucket sizes must lie in 1..{tier.max_slots}")
            if not span or span[0] < 1 or span[-1] > tier.capacity:
                raise ValueError(f"tier {t}'s bucket spans must lie in 1..{tier.capacity}")
            self.plans.append((size, span))
        self.replays: Counter[tuple[int, int, int]] = Counter()  # per (tier, size, span)
        self._buckets: dict[tuple[int, int, int], _Bucket] = {}
        self._graph_pool: Any = None

    @property
    def ready(self) -> list[tuple[int, int, int]]:
        """(tier, batch size, span) of the buckets prepared so far."""
        return sorted(self._buckets)

    def prepare(self, budget_s: float) -> str:
        """Capture or compile every bucket in turn within `budget_s` (module docstring)."""
        if self.kind == "eager":
            return "decode step: eager (no capture)"
        if self.pool.size:
            raise RuntimeError("prepare the decode step before any answer takes a slot")
        self.pool.allocate()
        start = time.perf_counter()
        order = sorted(((t, b, s) for t, (sizes, spans) in enumerate(self.plans)
                        for b in sizes for s in spans),
                       key=lambda k: (k[2] != self.plans[k[0]][1][-1], k))  # full spans first
        # one compiled entry a bucket, all of one function: allow them all
        with torch._dynamo.config.patch(recompile_limit=max(8, len(order))):
            for key in order:
                if key in self._buckets:
                    continue
                if time.perf_counter() - start > budget_s:
                    break
                self._buckets[key] = self._build(*key)
        took = time.perf_counter() - start
        left = [key for key in order if key not in self._buckets]
        tiers = [(t.max_slots, t.capacity) for t in self.pool.tiers]
        return (f"decode step: {self.kind} for {len(self.ready)} buckets (tiers of (slots, "
                f"capacity) {tiers}; batch sizes, spans {self.plans}) in {took:.1f} s "
                f"(budget {budget_s:.0f} s)"
                + (f"; {left} run eager (budget spent)" if left else ""))

    def _build(self, tier: int, b: int, span: int) -> _Bucket:
        slots = self.pool.tiers[tier]
        assert slots.keys is not None and slots.values is not None
        keys, values = slots.keys, slots.values
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

    def _bucket_for(self, tier: int, n: int, keys: int) -> tuple[int, int, int] | None:
        """The smallest prepared bucket of `tier` of at least `n` rows and a span of `keys`."""
        fits = [k for k in self._buckets if k[0] == tier and k[1] >= n and k[2] >= keys]
        return min(fits) if fits else None

    def covers(self, tier: int, rows: list[StepRow]) -> bool:
        """Whether `rows` are every occupied slot of `tier` (in any order) and a bucket of
        the tier holds them."""
        n = len(rows)
        return (n > 0 and n == self.pool.tiers[tier].size
                and all(r.tier == tier for r in rows)
                and sorted(r.slot if r.slot is not None else -1 for r in rows) == list(range(n))
                and self._bucket_for(tier, n, max(r.n_keys for r in rows)) is not None)

    def step(self, tier: int, rows: list[StepRow], tokens: list[torch.Tensor]) -> torch.Tensor:
        """Logits (n, vocab), in the order of `rows`, of one step of `tier`'s pooled `rows`,
        whose token ids are `tokens` (n 0-d tensors on the device), in the smallest prepared
        bucket of the tier that holds them."""
        n = len(rows)
        key = self._bucket_for(tier, n, max(r.n_keys for r in rows))
        assert key is not None, "covers() first"
        bucket = self._buckets[key]
        by_slot = sorted(range(n), key=lambda i: rows[i].slot or 0)
        pad = [0] * (int(bucket.tokens.shape[0]) - n)
        bucket.host.copy_(torch.tensor([[rows[i].n_keys - 1 for i in by_slot] + pad,
                                        [rows[i].position_id for i in by_slot] + pad]))
        bucket.meta.copy_(bucket.host, non_blocking=True)  # (2, b)
        bucket.tokens[:n].copy_(torch.stack([tokens[i] for i in by_slot]))  # (n,)
        out = bucket.run()  # (b, vocab), row j = slot j
        self.replays[key] += 1
        if by_slot == list(range(n)):
            return out[:n].clone()
        return torch.stack([out[r.slot or 0] for r in rows])  # (n, vocab)
