"""The runtime's observation hook (`conduit_core.pass_observer`): an observer sees every phase
of an answer's prefill, in order, each with its results in the assembly on exit, and watching
changes nothing in the answer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.pass_observer import Phase
from conduit_core.passes.assembly import Assembly
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES, own_flops

QUESTION = "What does the second page show?"


class Recorder:
    """Records each phase it sees, and whether the scoring pass's result was there on exit."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @contextmanager
    def phase(self, name: Phase, assembly: Assembly) -> Iterator[None]:
        self.seen.append(("enter", name))
        yield
        self.seen.append(("exit", name))
        if name == "scoring":
            assert assembly.stale is not None and assembly.stale_writes == assembly.cache.writes


@pytest.fixture(scope="module")
def runtime(model_cache: Path) -> ReuseRuntime:
    return ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache))


def _request(runtime: ReuseRuntime, policy: str) -> AnswerRequest:
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"]])
    pages = [PageInput(f"Page {i}:\n", kv) for i, kv in enumerate(kvs, 1)]
    return AnswerRequest("Be brief.", pages, QUESTION, policy=choose_policy(policy), budget=0.1,
                         max_new_tokens=4)


@pytest.mark.parametrize(("policy", "phases"), [
    ("conduit", ["page_load", "scoring", "refresh", "logits"]),
    ("full_reuse", ["page_load", "refresh", "logits"]),  # no scoring pass to choose
])
def test_an_observer_sees_each_phase_in_order(runtime: ReuseRuntime, policy: str,
                                              phases: list[str]) -> None:
    request = _request(runtime, policy)
    unobserved = answering.answer(runtime, request)
    recorder = Recorder()
    with answering.observing(runtime, recorder):
        observed = answering.answer(runtime, request)
    assert recorder.seen == [(edge, p) for p in phases for edge in ("enter", "exit")]
    assert observed.token_ids == unobserved.token_ids
    assert own_flops(observed) == own_flops(unobserved)  # the second runs on warm caches
    assert runtime.reuse.observer is None  # given back after the block
