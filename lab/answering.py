"""Answers on the product runtime's surface, for the lab and the tests.

The product answers through `ReuseRuntime.prefill_steps` and batched decode steps run by the
answer engine (`worker/engine.py`). Evaluations, benchmarks and tests want one answer at a
time, the prefill half alone, a full prefill from the page images (the yardstick), or the
page labels computed ahead; this module builds each from the runtime's own steps
(`prefill_steps`, `step`, `result`, `ReuseRuntime.reuse`), so that what the lab measures is
the product's computation and not a copy of it. `observing` sets the runtime's one hook, a
`PassObserver` that sees each phase of a prefill, for the length of a block.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from PIL import Image

from conduit_core.answer_state import AnswerState
from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput, TokenCallback
from conduit_core.errors import InvalidRequestError
from conduit_core.kv.kv_cache import KVCache
from conduit_core.label_cache import fetch
from conduit_core.pass_observer import PassObserver
from conduit_core.passes.assembly import Assembly
from conduit_core.prompt.layout import build_layout
from conduit_core.runtime import ReuseRuntime


def start_answer(runtime: ReuseRuntime, request: AnswerRequest,
                 on_token: TokenCallback | None = None, t0: float | None = None) -> AnswerState:
    """The prefill half of an answer: `runtime.prefill_steps` run through all its phases."""
    steps = runtime.prefill_steps(request, on_token, t0)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            state: AnswerState = done.value
            return state


def finish(runtime: ReuseRuntime, state: AnswerState) -> AnswerResult:
    """Decode one answer alone to its end (`runtime.step` with a batch of one); what its
    token callback raised is raised here."""
    while not state.done:
        runtime.step([state])
    if state.error is not None:
        raise state.error
    return runtime.result(state)


def answer(runtime: ReuseRuntime, request: AnswerRequest,
           on_token: TokenCallback | None = None) -> AnswerResult:
    """One whole answer over cached pages, as the engine runs it for a batch of one."""
    return finish(runtime, start_answer(runtime, request, on_token))


@torch.no_grad()
def assemble_fresh(runtime: ReuseRuntime, prefix: str, pages: list[tuple[str, Image.Image]],
                   question: str, extra_capacity: int = 0,
                   last_only: bool = False) -> Assembly:
    """Lay out a request from page images (vision tower run now); the cache starts empty."""
    adapter = runtime.adapter
    images = [img for _, img in pages]
    prepared = adapter.prepare_pages(images) if images else []
    seg_embeds = adapter.page_embeds(prepared) if prepared else []
    grids = [p.image_grid for p in prepared]
    layout = build_layout(adapter, prefix, [label for label, _ in pages],
                          [p.token_ids for p in prepared], grids, question)
    embeds = adapter.embed_tokens(layout.token_ids)  # (N, hidden)
    for seg, emb in zip(layout.segments, seg_embeds, strict=True):
        embeds[seg.start:seg.stop] = emb.to(embeds.device, embeds.dtype)
    cache = KVCache.allocate(adapter, 1, layout.n + extra_capacity)
    return Assembly(layout=layout, cache=cache, embeds=embeds, image_grids=grids,
                    last_only=last_only)


def prefill(runtime: ReuseRuntime, assembly: Assembly, visual_rows: torch.Tensor) -> torch.Tensor:
    """Recompute `visual_rows` and all text rows of `assembly`, writing their K/V; their
    last-layer hidden states (R, hidden) in row order (`ReuseSteps.refresh`)."""
    return runtime.reuse.refresh(assembly, visual_rows)[0]


@torch.no_grad()
def answer_full_prefill(runtime: ReuseRuntime, prefix: str,
                        pages: list[tuple[str, Image.Image]], question: str, *,
                        max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                        seed: int | None = None,
                        on_token: TokenCallback | None = None) -> AnswerResult:
    """Answer with no reuse at all: vision tower and every token computed now."""
    t0 = time.perf_counter()
    if max_new_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise InvalidRequestError("need max_new_tokens >= 1, temperature >= 0, "
                                  "0 < top_p <= 1")
    steps = runtime.reuse
    assembly = assemble_fresh(runtime, prefix, pages, question, extra_capacity=max_new_tokens,
                              last_only=True)
    visual = assembly.layout.visual_rows()
    hidden, computed = steps.refresh(assembly, visual)
    return finish(runtime, steps.start_decode(
        assembly, hidden, t0=t0, policy="full_prefill", refreshed=int(visual.numel()),
        flops_used_lm=steps.refresh_flops(assembly, computed), vision_ran=True,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
        on_token=on_token))


def warm_labels(runtime: ReuseRuntime, prefix: str, pages: list[PageInput],
                namespace: str = "") -> float:
    """Compute the head and the labels of `pages` under `prefix` that the runtime's caches
    lack, without assembling anything (an evaluation does it with the pages, before its
    policies, so that no policy's row carries them); their LM FLOPs."""
    steps = runtime.reuse
    if steps.labels is None or steps.heads is None or not pages:
        return 0.0
    layout = build_layout(runtime.adapter, prefix, [p.label for p in pages],
                          [p.kv.token_ids for p in pages],
                          [p.kv.image_grid for p in pages], "")
    head, computed = steps.heads.get(runtime.adapter, namespace,
                                     layout.token_ids[:layout.head],
                                     layout.position_ids[:, :layout.head])
    spent = steps.costs.head(head.n) if computed else 0.0
    return spent + sum(fetch(steps.labels, runtime.adapter, steps.costs, namespace, head,
                             layout.token_ids[s.start:s.stop])[1] for s in layout.labels)


@contextmanager
def observing(runtime: ReuseRuntime, observer: PassObserver) -> Iterator[None]:
    """Within the block `observer` sees each phase of the runtime's prefills (op counts,
    phase times); the runtime's earlier observer, if any, is back after it."""
    steps = runtime.reuse
    saved, steps.observer = steps.observer, observer
    try:
        yield
    finally:
        steps.observer = saved
