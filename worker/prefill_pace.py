"""How much of a newcomer's prefill one engine step runs before the running answers' decode
step, so that their tokens keep their pace while questions arrive.

A running answer waits, between two tokens, for the step's prefill work plus one decode step.
The pace keeps that wait near `1 + share` decode steps: a step's prefill budget is `share`
times the running batch's decode step time (the median of the last few steps, so that one
slow step does not hand the next a long budget), and a phase starts only when the time it is
expected to take still fits. Under overload, when more questions wait than there are free
slots (`backlog` of them beyond), the budget grows to `share * (1 + backlog)` decode steps:
then the batch is kept full, since a batch that cannot fill costs every answer more time a
token than a stream's stutter costs it. A phase's expected time is learned online, per the
phase that came before it (a scoring group is followed by another or by the choice, the
choice by a refresh group), as a moving average. The first phase of a step always runs: a newcomer's
prefill advances at every step, whatever its phases cost.

Without running answers there is nothing to keep flowing: the prefill runs whole. A fixed
budget (seconds) replaces the rule where one is given: 0 runs one phase a step.
"""

from __future__ import annotations

import statistics
from collections import deque

RECENT_STEPS = 8  # decode steps the pace is the median of
SMOOTHING = 0.3  # weight of the newest observation in a phase's expected time


class PrefillPace:
    """The prefill budget of a step and whether its next phase fits; see the module
    docstring. Used by the engine's thread only."""

    def __init__(self, share: float, fixed_s: float | None = None) -> None:
        if share < 0:
            raise ValueError(f"the prefill share must be >= 0, got {share}")
        self.share = share
        self.fixed_s = fixed_s
        self._steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self._after: dict[str, float] = {}  # phase -> expected seconds of the phase after it

    def decoded(self, seconds: float) -> None:
        """A batched decode step took `seconds`."""
        self._steps.append(seconds)

    def budget(self, decoding: bool, backlog: int = 0) -> float:
        """The prefill seconds of a step that decodes (`decoding`) while `backlog` questions
        wait beyond the free slots."""
        if self.fixed_s is not None:
            return self.fixed_s
        if not decoding:
            return float("inf")
        if not self._steps:
            return 0.0  # one phase, until a decode step has been timed
        return self.share * (1 + backlog) * statistics.median(self._steps)

    def ran(self, previous: str | None, seconds: float) -> None:
        """A phase that followed `previous` (None: a prefill's first) took `seconds`."""
        key = previous or ""
        old = self._after.get(key)
        self._after[key] = seconds if old is None else old + SMOOTHING * (seconds - old)

    def fits(self, previous: str | None, spent: float, budget: float) -> bool:
        """Whether the phase after `previous` may start with `spent` of `budget` gone."""
        return spent + self._after.get(previous or "", 0.0) <= budget
