"""A per-document deadline, checked between pages."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.ingest.errors import IngestTimeoutError


@dataclass
class Deadline:
    """Raises `IngestTimeoutError` from `check()` once `seconds` have passed since creation.

    Work inside one page (a render, an OCR call) is not interrupted: the check runs between
    steps, so a document can overrun by at most one step.
    """

    seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise ValueError("a deadline needs a positive number of seconds")
        if self.started < 0:
            self.started = self.clock()

    @property
    def elapsed(self) -> float:
        """Seconds since the deadline was created."""
        return self.clock() - self.started

    @property
    def expired(self) -> bool:
        """True once the time is up."""
        return self.elapsed > self.seconds

    def check(self, pages_done: int, pages_total: int) -> None:
        """Raise `IngestTimeoutError` if the time is up."""
        if self.expired:
            raise IngestTimeoutError(self.seconds, pages_done, pages_total)
