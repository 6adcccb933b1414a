"""`StepGraphs`: a function of fixed-address tensors captured once per shape as a CUDA graph, then replayed.

A CUDA graph records the kernels a function launches and replays them with one launch, without the host's per-kernel
work: the function must read and write tensors that keep their addresses, and read nothing back to the host. The
capture needs a warm-up run first (lazy initialisations, workspaces), and that run really executes: the caller
provides `idle`, a context in which running the function changes no state that matters (for `GraphDecoder`: every
row of the batch inactive, so a decoding step writes only to scratch).

The function must draw no random numbers: a caller draws them before each call into a tensor the function reads
(`GraphDecoder` draws its sampling noise so). A graph that drew them would replay on a generator state of its own
(below), not on the seeded default generator.

All graphs share one memory pool: their temporaries live only during a replay and graphs never replay at once, and
every input and output is a tensor allocated outside the pool. A capture that fails (an operation that cannot be
captured, a CUDA call the capture forbids, no CUDA device) is remembered in `error`, logged as a warning, and every
later call runs the function eagerly. It leaves behind none of what a failed capture can leave:

- PyTorch's default CUDA generator. Every capture marks the generator state the default generator holds as
  capturing before the capture begins, and unmarks it only once the capture has ended well
  (`CUDAGraph::capture_begin` / `capture_end`); a capture that fails in between leaves it marked, and from then on
  every random draw outside a capture fails ("Offset increment outside graph capture encountered unexpectedly"):
  eager sampling, and the replay of every graph captured on that state. Here the default generator holds a private
  state during the capture (`Generator.graphsafe_set_state`), and its own state back after, whatever happened.
- The current stream (`torch.cuda.graph` leaves its capture stream current when ending the capture fails).
- Python's garbage collector, paused during the capture: a finalizer run in the middle of it (another graph freed,
  say) can make a CUDA call the capture forbids, and the capture fails (pytorch/pytorch PR 161037: intermittent
  capture failures so, once `torch.cuda.graph` stopped collecting garbage before each capture).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ContextManager, Hashable

__all__ = ["StepGraphs"]

logger = logging.getLogger(__name__)


class StepGraphs:
    """Replayed CUDA graphs of step functions, one per key (see the module docstring).

    Args:
        enabled: capture graphs (False: every step runs eagerly, as on a CPU).
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        #: Why capture was given up (then every step runs eagerly), or None.
        self.error: str | None = None
        #: Graphs captured so far.
        self.captured = 0
        self._graphs: dict[Hashable, Any] = {}
        self._pool = None

    def clear(self) -> None:
        """Forget the graphs (the tensors they read were replaced)."""
        self._graphs.clear()

    def release(self) -> None:
        """Forget the graphs and free their memory pool."""
        self._graphs.clear()
        self._pool = None

    def runner(self, key: Hashable, step: Callable[[], None], idle: Callable[[], ContextManager]) -> Callable[[], None]:
        """What runs `step`: the replay of its graph under `key` (captured now if new, its warm-up inside `idle()`),
        or `step` itself when graphs are off or a capture has failed."""
        if not self.enabled:
            return step
        graph = self._graphs.get(key)
        if graph is None:
            try:
                with idle():
                    graph = self._capture(step)
            except Exception as exc:  # noqa: BLE001 - decode eagerly rather than not at all
                self.enabled = False
                self.error = _why(exc)
                self._graphs.clear()
                logger.warning("capturing a CUDA graph failed, running its steps eagerly from now on: %s", self.error)
                return step
            self._graphs[key] = graph
            self.captured += 1
        return graph.replay

    def _capture(self, step: Callable[[], None]) -> Any:
        import gc

        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.current_stream()
        side = torch.cuda.Stream()  # the warm-up runs on a side stream, as torch.cuda.graph asks
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            step()
        stream.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        default = torch.cuda.default_generators[torch.cuda.current_device()]
        held = default.graphsafe_get_state()
        collecting = gc.isenabled()
        gc.disable()
        try:
            # What the capture marks (and, if it fails, leaves marked) is a private state, never the default one.
            default.graphsafe_set_state(torch.Generator(device=stream.device))
            # Capture errors are this thread's alone (another thread's CUDA call, say a status reader, does not
            # break it).
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step()
        finally:
            default.graphsafe_set_state(held)
            torch.cuda.set_stream(stream)
            if collecting:
                gc.enable()
        return graph


def _why(exc: BaseException) -> str:
    """The error that ended a capture, with the one that broke it first when another did (ending a capture that an
    operation broke raises an error of its own: the cause is the one before)."""
    def line(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"

    why = line(exc)
    first = exc.__cause__ or exc.__context__
    if first is not None and first is not exc:
        why += f" (after {line(first)})"
    return why[:500]
