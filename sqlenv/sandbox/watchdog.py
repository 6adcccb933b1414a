"""The watchdog: one daemon thread per process that interrupts every sandbox statement at its deadline, and stops
the one that has run longest when another needs its memory (`sqlenv.sandbox.heap_room`).

A statement is any object with `deadline` (the `time.monotonic()` time its limit ends; another value once it has
ended) and `interrupt_if_due(deadline, for_memory=False)`: `sqlenv.sandbox.sql_runner.Database`.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
import weakref
from typing import Any

__all__ = ["Watchdog", "WATCHDOG"]


class Watchdog:
    """One daemon thread per process that interrupts statements at their deadlines (`sqlite3_interrupt`).

    The progress handler alone checks the clock only when SQLite calls back into Python, which needs the
    interpreter lock: with many sessions' statements running at once (each releases the lock inside SQLite)
    those checks were late by seconds on a loaded machine. The interrupt flag is read by SQLite itself at
    every jump, with no lock to take."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Empty and threadless: at start, and in a forked child (which inherits no threads)."""
        self._heap: list[tuple[float, int, Any]] = []
        self._count = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, db: Any, deadline: float) -> None:
        with self._wake:
            self._count += 1
            heapq.heappush(self._heap, (deadline, self._count, weakref.ref(db)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sqlenv-sandbox-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][1] == self._count:  # a new earliest deadline: wake up sooner
                self._wake.notify()

    # Deadlines due within this many seconds are handled in one wake-up: thousands of short statements a second
    # cost a few dozen wake-ups, not one each (a late interrupt is late by at most this much).
    GRANULARITY_S = 0.05

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(None if not self._heap
                                    else self._heap[0][0] - time.monotonic() + self.GRANULARITY_S)
                due = []
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    deadline, _, ref = heapq.heappop(self._heap)
                    due.append((deadline, ref))
            for deadline, ref in due:  # statements that ended long ago have another deadline (or none): skipped
                db = ref()
                if db is not None and db.deadline == deadline:
                    db.interrupt_if_due(deadline)

    def stop_oldest(self, before: float) -> bool:
        """Interrupt, to free its memory, the running statement with the earliest deadline earlier than `before`
        (the one that has run longest, when time limits are alike); False when there is none."""
        with self._wake:
            running = [(deadline, db) for deadline, _, ref in self._heap
                       if deadline < before and (db := ref()) is not None and db.deadline == deadline]
        for deadline, db in sorted(running, key=lambda item: item[0]):
            if db.interrupt_if_due(deadline, for_memory=True):
                return True
        return False


WATCHDOG = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG._reset)
