"""Query results kept between steps, bounded in total across every environment of the process.

An environment keeps its episode's last successful QUERY result until the episode ends, so that execution accuracy
can reuse it (`sqlenv.scoring.execution`). One result holds at most `max_result_bytes` (32 MB), but a server holds one
environment per session: 20 sessions each keeping a ~32 MB result took +634 MB, and 64 would keep ~2 GB
(issue 35). `KEPT_RESULTS` counts what all of them keep; past `max_kept_result_bytes` the results kept longest are
dropped. Dropping one loses nothing but time: when its episode ends, EX runs the query's official text again, as
it does for a result cut at the row cap.

An environment holds a `Kept` handle; the registry holds only weak references, so a result is freed as soon as its
environment lets go of the handle (a new result, a reset, `close`, or the environment itself gone), and the
registry forgets it at its next count. Keeping a result costs O(1) unless the budget is reached.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any

__all__ = ["Kept", "KeptResults", "KEPT_RESULTS"]


class Kept:
    """One kept result (`result`: None once the registry dropped it)."""

    __slots__ = ("result", "__weakref__")

    def __init__(self, result: Any):
        self.result = result


class KeptResults:
    """What the environments of a process keep between steps, oldest first; thread-safe.

    A result is counted at its `nbytes`, an upper bound (`sqlenv.sandbox.sql_runner.QueryResult`: a small last batch is
    not measured when it is fetched); only when the bounds add up past the budget are the results measured
    (`held_bytes()`, once each), then the oldest dropped. Most steps keep a few rows and measure nothing."""

    def __init__(self) -> None:
        self._kept: OrderedDict[int, list] = OrderedDict()  # key -> [weak handle, bytes counted, measured]
        self._total = 0
        self._gone: list[int] = []  # handles let go of by their environments (appended by weakref callbacks)
        self._order = itertools.count()
        self._lock = threading.Lock()

    def _forget_gone(self) -> None:
        while self._gone:
            entry = self._kept.pop(self._gone.pop(), None)
            if entry is not None:
                self._total -= entry[1]

    def keep(self, result: Any, max_bytes: int) -> Kept:
        """A handle on `result` (a `QueryResult`), counted with every result still kept; then, while they hold more
        than `max_bytes` together, the ones kept longest are dropped (this one last)."""
        kept = Kept(result)
        key = next(self._order)
        with self._lock:
            self._forget_gone()
            self._kept[key] = [weakref.ref(kept, lambda _, key=key: self._gone.append(key)), result.nbytes, False]
            self._total += result.nbytes
            if self._total > max_bytes:
                self._measure()
            while self._total > max_bytes and self._kept:
                _, (ref, counted, _measured) = self._kept.popitem(last=False)
                self._total -= counted
                held = ref()
                if held is not None:
                    held.result = None
        return kept

    def _measure(self) -> None:
        """Count every kept result at its measured size instead of its bound."""
        for entry in self._kept.values():
            held = entry[0]()
            if entry[2] or held is None or held.result is None:
                continue
            exact = held.result.held_bytes()
            self._total += exact - entry[1]
            entry[1], entry[2] = exact, True

    def held_bytes(self) -> int:
        """Bytes counted for the results kept now (an upper bound: some may be counted at their bound)."""
        with self._lock:
            self._forget_gone()
            return self._total


#: The process's registry: every `SQLEnvironment` keeps its last result through it.
KEPT_RESULTS = KeptResults()
