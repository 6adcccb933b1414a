"""Room in SQLite's shared heap: what a statement (or a connection being opened) that ran out of it may take back
from others.

SQLite has one heap per process under one hard limit (`SandboxSettings.max_heap_bytes`), and every session's
connections live on it: what their running statements build (sorts, temporary tables, CTE queues), and what each
open connection keeps between statements (its prepared statements, its page cache, its schema). When an
allocation fails while the heap is mostly held by others (`HEAP_FULL_SHARE`), room is made in this order:

1. idle connections are closed, least recently used first, whichever sandbox owns them: what they held comes back
   at once, and their sandbox opens them again (a few milliseconds) when next used. Idle sessions whose
   connections held their prepared statements used to leave every honest reset failing "out of memory";
2. the running statement that has run longest is stopped (`sqlenv.sandbox.watchdog`) and its memory awaited.

A connection takes part when it was registered with the lock its owner holds while it uses it
(`OpenConnections.add`): it is idle when that lock can be taken at once.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from sqlenv.sandbox.limits import HEAP
from sqlenv.sandbox.watchdog import WATCHDOG

__all__ = ["OpenConnections", "OPEN_CONNECTIONS", "make_room"]


class OpenConnections:
    """The process's open sandbox connections that may be closed while idle (weakly held).

    A connection is an object with `owner_lock` (held by its owner while it uses the connection), `last_used` (a
    `time.monotonic()` time), `closed` and `close()`: `sqlenv.sandbox.sql_runner.Database`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # a dropped one leaves

    def add(self, db: Any) -> None:
        with self._lock:
            self._open[id(db)] = db

    def remove(self, db: Any) -> None:
        with self._lock:
            if self._open.get(id(db)) is db:
                del self._open[id(db)]

    def close_idle(self, keep: Any = None) -> int:
        """Close idle connections, least recently used first, until the heap is no longer mostly held; how many
        were closed. One whose owner's lock is held (a statement of its sandbox runs, or is about to) is left
        alone, and so is `keep` (the caller's own)."""
        with self._lock:
            candidates = [db for db in self._open.values() if db is not keep]
        closed = 0
        for db in sorted(candidates, key=lambda db: db.last_used):
            if not HEAP.mostly_held():
                break
            if db.owner_lock.acquire(blocking=False):
                try:
                    if not db.closed:
                        db.close()
                        closed += 1
                finally:
                    db.owner_lock.release()
        return closed


OPEN_CONNECTIONS = OpenConnections()


def make_room(deadline: float, keep: Any = None, settle_s: float = 0.5, poll_s: float = 0.01) -> bool:
    """After a statement (or a connection being opened) ran out of SQLite's shared heap and gave back what it
    held: whether to try it once more. When the heap is still mostly held by others, idle connections other than
    `keep` are closed first; if that is not enough, the running statement that has run longest (its deadline before
    `deadline`) is stopped, and this waits for its memory to come back (at most `settle_s`). No when the statement
    was too big by itself, when nothing could be freed, or when time is up.

    Callers make room once per statement: SQLite reports a program past `max_program_ops` as out of memory too,
    and such a statement, sent while the heap is full, must not stop one statement after another."""
    if not HEAP.mostly_held():
        return False
    closed = OPEN_CONNECTIONS.close_idle(keep)
    if not HEAP.mostly_held():
        return time.monotonic() < deadline
    if not WATCHDOG.stop_oldest(before=deadline):
        return closed > 0 and time.monotonic() < deadline
    settled = min(deadline, time.monotonic() + settle_s)
    while HEAP.mostly_held() and time.monotonic() < settled:
        time.sleep(poll_s)
    return time.monotonic() < deadline
