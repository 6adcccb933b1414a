"""`StepGraphs`: a function of fixed-address tensors captured once per shape as a CUDA graph, then replayed.

A CUDA graph records the kernels a function launches and replays them with one launch, without the host's per-kernel
work: the function must read and write tensors that keep their addresses, and read nothing back to the host. The
capture needs a warm-up run first (lazy initialisations, workspaces), and that run really executes: the caller
provides `idle`, a context in which running the function changes no state that matters (for `GraphDecoder`: every
row of the batch inactive, so a decoding step writes only to scratch).

All graphs share one memory pool: their temporaries live only during a replay and graphs never replay at once, and
every input and output is a tensor allocated outside the pool. A capture that fails (an operation that cannot be
captured, no CUDA device) is remembered in `error` and every later call runs the function eagerly.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Hashable

__all__ = ["StepGraphs"]


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
                self.error = f"{type(exc).__name__}: {exc}"[:500]
                self._graphs.clear()
                return step
            self._graphs[key] = graph
            self.captured += 1
        return graph.replay

    def _capture(self, step: Callable[[], None]) -> Any:
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()  # the warm-up runs on a side stream, as torch.cuda.graph asks
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # Capture errors are this thread's alone (another thread's CUDA call, say a status reader, does not break it).
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step()
        return graph
