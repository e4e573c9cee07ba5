"""Compiled passes warmed at startup: the shape buckets a default question meets compiled
before the first user's request, within a time budget, each logged with its compile time.

Where the scoring pass's and the refresh's layers run compiled (`passes.layer_graphs`), a
bucket compiles the first time a pass needs it. `warm_passes` runs a default-size answer
prefill (the service's default policy, budget and answer length; questions of a few lengths,
since a question's tokens are rows of the refresh) over 1, 2, ..., `max_pages` copies of one
blank page through the runtime's own path, so that every
(piece, rows, keys) bucket those requests meet is compiled; a later request whose buckets
were met compiles nothing. The answers run in their own namespace (`WARMUP_NAMESPACE`), so
no tenant's head, label or choice caches see them, and their decode slots are given back
before any user's answer. The budget bounds the page counts started (a count started is
finished); buckets met later compile then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from PIL import Image

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.passes.layer_graphs import layer_graphs
from conduit_core.policies import PolicyChoice, choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY
from conduit_core.runtime import ReuseRuntime

WARMUP_NAMESPACE = "conduit-pass-warmup"
WARMUP_WORDS = "what does the table on this page say about the yearly totals and costs".split()


def warmup_question(words: int) -> str:
    """A question of `words` words (about 1.2 tokens each)."""
    return " ".join(WARMUP_WORDS[i % len(WARMUP_WORDS)] for i in range(words)) + "?"


@dataclass(frozen=True)
class WarmupSpec:
    """What the warm-up's requests look like: the service's defaults for a question (its
    prompt prefix and page labels count among the keys, hence the buckets)."""

    max_pages: int  # page counts 1..max_pages are run
    budget_s: float  # no page count starts after this many seconds
    prefix: str = ""
    policy: PolicyChoice = field(default_factory=lambda: choose_policy(DEFAULT_POLICY))
    label: Callable[[int], str] = field(default=lambda number: f"Page {number}")
    budget: float = 0.1
    max_new_tokens: int = 64
    question_words: tuple[int, ...] = (6, 14, 30, 60)  # the questions' lengths, in words


def _prefill(runtime: ReuseRuntime, request: AnswerRequest) -> None:
    """`request`'s prefill through all its phases; its decode slot given back."""
    steps = runtime.prefill_steps(request)
    while True:
        try:
            next(steps)
        except StopIteration as finished:
            runtime.release(finished.value)
            return


def warm_passes(runtime: ReuseRuntime, spec: WarmupSpec) -> list[str]:
    """Run `spec`'s requests through `runtime`'s compiled passes, each page count with every
    question length; one log line per page count (the buckets it compiled, the seconds taken)
    and a summary. Nothing is run (one line says so) where the passes run eagerly."""
    graphs = layer_graphs(runtime.adapter)
    if graphs is None:
        return ["pass warm-up: passes run eagerly (nothing to compile)"]
    start = time.perf_counter()
    side = 28 * 16  # a page of the model's default visual tokens or fewer
    page = runtime.prefill_pages([Image.new("RGB", (side, side), "white")])[0]
    lines, done = [], 0
    for n in range(1, spec.max_pages + 1):
        if time.perf_counter() - start > spec.budget_s:
            break
        before, t0 = set(graphs.shapes), time.perf_counter()
        pages = [PageInput(spec.label(i + 1), page) for i in range(n)]
        for words in spec.question_words:
            request = AnswerRequest(spec.prefix, pages, warmup_question(words),
                                    policy=spec.policy, budget=spec.budget,
                                    max_new_tokens=spec.max_new_tokens,
                                    namespace=WARMUP_NAMESPACE)
            _prefill(runtime, request)
        new = sorted(graphs.shapes - before)
        lines.append(f"pass warm-up: {n} page(s) compiled {len(new)} bucket(s) {new} in "
                     f"{time.perf_counter() - t0:.1f} s")
        done = n
    took = time.perf_counter() - start
    left = f"; {done + 1}..{spec.max_pages} pages left to compile on first use" \
        if done < spec.max_pages else ""
    lines.append(f"pass warm-up: {len(graphs.shapes)} buckets over 1..{done} pages in "
                 f"{took:.1f} s (budget {spec.budget_s:.0f} s){left}")
    return lines
