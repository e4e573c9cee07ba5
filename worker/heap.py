"""Keep the cyclic garbage collector off the long-lived heap.

A service process holds millions of objects that live as long as it does (torch, transformers,
their modules). Python's full (generation 2) collection walks all of them, holding the
interpreter lock, and one such pause in a Celery worker under load stops its engine (every
stream of its batch) for that long. The entry points (`conduit serve`, `conduit worker`)
call `freeze_long_lived` once their imports are done: it collects once, then moves every
object alive into the permanent generation (`gc.freeze`), which collections skip, so they
walk only what was made since (measured: docs/DECISIONS.md, "Server processes freeze their
imports' objects"). Not called where tests build apps and contexts by the hundred: frozen
objects are never collected, so a process that makes and drops many apps would keep them all.
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """Collect what is garbage now, then move every object alive to the permanent
    generation, where collections no longer walk it."""
    gc.collect()
    gc.freeze()
