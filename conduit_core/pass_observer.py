"""The runtime's one observation hook: a `PassObserver` sees each phase of an answer's prefill.

An answer's prefill runs four phases on an assembly: the pages' K/V loaded and re-rotated
into its cache (`"page_load"`), the scoring pass (`"scoring"`), the refresh (`"refresh"`) and
the first token's logits (`"logits"`). The runtime runs each inside the context manager its
observer returns for it, so an observer can count what a phase dispatches (a
`TorchDispatchMode` is such a context manager), time it, or read the assembly after it; the
lab's op counts and A/B measurements do so (`lab/ttft/op_count.py`, `lab/ttft/ab.py`) instead
of overriding the runtime's methods, so the runtime's inside can change under them.

With no observer set (the product) a phase runs inside one shared `nullcontext`: nothing is
allocated or called beyond it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Literal, Protocol

from conduit_core.passes.assembly import Assembly

Phase = Literal["page_load", "scoring", "refresh", "logits"]

UNOBSERVED: AbstractContextManager[None] = nullcontext()  # the context of every phase unobserved


class PassObserver(Protocol):
    """What the runtime calls around each phase of a prefill (module docstring)."""

    def phase(self, name: Phase, assembly: Assembly) -> AbstractContextManager[object]:
        """The context the runtime runs phase `name` of `assembly` in; on its exit the phase
        is done and its results are in `assembly` (the scoring pass's in `assembly.stale`)."""
        ...
