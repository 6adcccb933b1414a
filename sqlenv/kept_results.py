"""Query results kept between steps, bounded in total across every environment of the process.

An environment keeps its episode's last successful QUERY result until the episode ends, so that execution accuracy
can reuse it (`sqlenv.execution`). One result holds at most `max_result_bytes` (32 MB), but a server holds one
environment per session: 20 sessions each keeping a ~32 MB result took +634 MB, and 64 would keep ~2 GB
(issue 35). `KEPT_RESULTS` counts what all of them keep; past `max_kept_result_bytes` the results kept longest are
dropped. Dropping one loses nothing but time: when its episode ends, EX runs the query's official text again, as
it does for a result cut at the row cap.

An environment holds a `Kept` handle; the registry holds only weak references, so a result is freed as soon as its
environment lets go of the handle (a new result, a reset, `close`, or the environment itself gone), and the
registry forgets it at its next count.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from typing import Any

__all__ = ["Kept", "KeptResults", "KEPT_RESULTS"]


class Kept:
    """One kept result (`result`: None once the registry dropped it) and the bytes it holds."""

    __slots__ = ("result", "nbytes", "__weakref__")

    def __init__(self, result: Any, nbytes: int):
        self.result, self.nbytes = result, int(nbytes)


class KeptResults:
    """What the environments of a process keep between steps, oldest first; thread-safe."""

    def __init__(self) -> None:
        self._kept: OrderedDict[int, weakref.ref[Kept]] = OrderedDict()
        self._order = itertools.count()
        self._lock = threading.Lock()

    def keep(self, result: Any, nbytes: int, max_bytes: int) -> Kept:
        """A handle on `result` (`nbytes` held), counted with every result still kept; then, while they hold more
        than `max_bytes` together, the ones kept longest are dropped (this one last)."""
        kept = Kept(result, nbytes)
        with self._lock:
            self._kept[next(self._order)] = weakref.ref(kept)
            total = 0
            live: list[tuple[int, Kept]] = []
            for key, ref in list(self._kept.items()):
                held = ref()
                if held is None or held.result is None:
                    del self._kept[key]  # let go of by its environment, or dropped before
                else:
                    live.append((key, held))
                    total += held.nbytes
            for key, held in live:
                if total <= max_bytes:
                    break
                held.result = None
                total -= held.nbytes
                del self._kept[key]
        return kept

    def held_bytes(self) -> int:
        """Bytes of the results kept now (by handles still alive)."""
        with self._lock:
            return sum(held.nbytes for ref in self._kept.values()
                       if (held := ref()) is not None and held.result is not None)


#: The process's registry: every `SQLEnvironment` keeps its last result through it.
KEPT_RESULTS = KeptResults()
