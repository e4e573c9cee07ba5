"""Layer groups: how a long pass is cut so that a scheduler can run other work inside it.

The scoring pass and the refresh run every row through every decoder layer; on a slow device
one such pass takes several decode steps' time. Run as generators (`stale_steps`,
`refresh_steps`), they yield a phase name after each group of `size` layers, so that the
answer engine can run a decode step of the answers already streaming before the next group.
A group is the same layers a whole pass would run, in the same order and with the same
operations: cutting a pass changes when its layers run, never what they compute.

`size` 0 (or at least the pass's layers) runs the pass as one group, yielding nothing. With
`size` 1 the refresh also yields between a layer's attention and its MLP
(`layer_forward.forward_rows_steps`): on the CPU one refresh layer of a few pages costs about
a decode step of a full batch, and its halves about half of one each.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


def layer_groups(layers: range, size: int) -> list[range]:
    """`layers` cut into consecutive runs of at most `size` layers (one run: `size` 0)."""
    if size <= 0 or len(layers) <= size:
        return [layers]
    return [range(s, min(s + size, layers.stop)) for s in range(layers.start, layers.stop, size)]


def drain(steps: Generator[str, None, T]) -> T:
    """Run a pass's `steps` to their end in one go; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            done: T = stop.value
            return done


def drained(steps: Callable[P, Generator[str, None, T]]) -> Callable[P, T]:
    """A function that runs the generator `steps` makes to its end (`drain`)."""
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return drain(steps(*args, **kwargs))
    return run
