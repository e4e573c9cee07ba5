"""The memory budget of a process's page readers, shared by all of them.

Each reader process runs under an address-space limit (`ReaderLimits.memory_mb`), so its
memory never exceeds that limit; the readers of one process (upload checks and ingests
together) may only start while the sum of their limits stays within the process's budget
(`READER_BUDGET`, unbounded until sized): a reader reserves its limit
before it is started and gives it back when it is closed (releasing twice is harmless).
So the readers' memory together never exceeds the budget, however many documents arrive.

Who waits: an upload check is refused at once when the budget is spent
(`ReaderBudgetError`, 503 with Retry-After: the client retries; nothing was stored and no
request thread is held waiting), an ingest waits for its turn (its document is already
accepted), and an ingest that could read pages with a second reader goes on with the one it
has rather than wait.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from worker.ingest.errors import ReaderBudgetError


@dataclass
class Reservation:
    """Megabytes of the budget held by one reader; `release` gives them back (once)."""

    budget: ReaderBudget
    mb: int
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        """Give the megabytes back (a second call does nothing)."""
        if not self._released:
            self._released = True
            self.budget._give_back(self.mb)


class ReaderBudget:
    """`total_mb` megabytes of reader address space for the whole process (0: unbounded).
    A reader whose limit alone exceeds a nonzero budget reserves the whole budget (it runs
    alone) rather than never running. Thread-safe."""

    def __init__(self, total_mb: int = 0) -> None:
        self.total_mb = total_mb
        self.in_use_mb = 0
        self.peak_mb = 0  # the most held at once since the process started
        self._cond = threading.Condition()

    def resize(self, total_mb: int) -> None:
        """Set the budget (the settings' value, given by each caller; the same in a process).
        Reservations held stay held; a smaller budget only delays the next readers."""
        with self._cond:
            if total_mb != self.total_mb:
                self.total_mb = total_mb
                self._cond.notify_all()

    def _fits(self, mb: int) -> bool:
        return not self.total_mb or self.in_use_mb + mb <= self.total_mb

    def _take(self, mb: int) -> Reservation:
        self.in_use_mb += mb
        self.peak_mb = max(self.peak_mb, self.in_use_mb)
        return Reservation(self, mb)

    def _need(self, mb: int) -> int:
        return min(mb, self.total_mb) if self.total_mb else mb

    def reserve(self, mb: int, wait_s: float) -> Reservation:
        """Reserve `mb`, waiting up to `wait_s` seconds for readers to give theirs back;
        `ReaderBudgetError` when it still does not fit."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._fits(self._need(mb)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReaderBudgetError(self.total_mb, self.in_use_mb)
                self._cond.wait(left)
            return self._take(self._need(mb))

    def _give_back(self, mb: int) -> None:
        with self._cond:
            self.in_use_mb -= mb
            self._cond.notify_all()


READER_BUDGET = ReaderBudget()
