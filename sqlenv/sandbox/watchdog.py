"""The watchdog: one daemon thread per process that interrupts every sandbox statement at its deadline, and stops
the one that has run longest when another needs its memory (`sqlenv.sandbox.heap_room`).

A statement is any object with `deadline` (the `time.monotonic()` time its limit ends, set before it is watched;
infinity once it has ended) and `interrupt_if_due(deadline, for_memory=False)`: `sqlenv.sandbox.sql_runner.Database`,
whose statements, one at a time, are watched through one entry at a time.
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
        # Per statement object (its weak reference): the deadline of its entry in the heap that is due first.
        self._armed: dict[Any, float] = {}
        self._count = 0
        self._lock = threading.Lock()  # taken directly on the hot path (`watch`): a Condition's `with` is Python
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def watch(self, db: Any, deadline: float) -> None:
        """Interrupt `db`'s statement at `deadline` (set as `db.deadline` before this call) unless it has ended.

        An object keeps one entry in the heap, not one per statement (thousands of statements a second kept tens
        of thousands, a push each): while its entry is due no later than `deadline`, nothing is pushed, and when
        that entry is due the watchdog arms the deadline its object has then (`_run`)."""
        ref = weakref.ref(db)
        with self._lock:
            armed = self._armed.get(ref)
            if armed is not None and armed <= deadline:
                return
            self._arm(ref, deadline)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sqlenv-sandbox-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][1] == self._count:  # a new earliest deadline: wake up sooner
                self._wake.notify()

    def _arm(self, ref: Any, deadline: float) -> None:  # under self._wake
        self._armed[ref] = deadline
        self._count += 1
        heapq.heappush(self._heap, (deadline, self._count, ref))

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
                    if self._armed.get(ref) != deadline:
                        continue  # an entry due later than the one that replaced it
                    db = ref()
                    current = db.deadline if db is not None else float("inf")
                    if current == deadline:
                        due.append((deadline, db))
                    elif deadline < current < float("inf"):  # a later statement runs: its deadline, armed now
                        self._arm(ref, current)
                        continue
                    del self._armed[ref]  # interrupted below, or idle (its next statement arms again)
            for deadline, db in due:  # statements that ended meanwhile have another deadline (or none): skipped
                db.interrupt_if_due(deadline)

    def stop_oldest(self, before: float) -> bool:
        """Interrupt, to free its memory, the running statement with the earliest deadline earlier than `before`
        (the one that has run longest, when time limits are alike); False when there is none."""
        with self._wake:
            running = [(db.deadline, db) for ref in self._armed if (db := ref()) is not None and db.deadline < before]
        for deadline, db in sorted(running, key=lambda item: item[0]):
            if db.interrupt_if_due(deadline, for_memory=True):
                return True
        return False


WATCHDOG = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG._reset)
