"""`freeze_long_lived` moves the objects alive into the permanent generation (collections skip
them) and collects the garbage first, so no cycle that was already garbage is kept."""

from __future__ import annotations

import gc
import weakref

from worker.heap import freeze_long_lived


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_freezing_keeps_the_living_and_frees_the_garbage() -> None:
    alive, dropped = _Node(), _Node()
    gone = weakref.ref(dropped)
    del dropped
    before = gc.get_freeze_count()
    try:
        freeze_long_lived()
        assert gone() is None  # collected before the freeze, not frozen with the living
        assert gc.get_freeze_count() > before
        assert alive.me is alive
    finally:
        gc.unfreeze()  # this test process makes and drops apps by the hundred
