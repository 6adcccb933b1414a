"""`StepGraphs`: a function of fixed-address tensors captured once per shape as a CUDA graph, then replayed.

A CUDA graph records the kernels a function launches and replays them with one launch, without the host's per-kernel
work: the function must read and write tensors that keep their addresses, and read nothing back to the host. The
capture needs a warm-up run first (lazy initialisations, workspaces), and that run really executes: the caller
provides `idle`, a context in which running the function changes no state that matters (for `GraphDecoder`: every
row of the batch inactive, so a decoding step writes only to scratch).

The function must draw no random numbers: a caller draws them before each call into a tensor the function reads
(`GraphDecoder` draws its sampling noise so). A graph that drew them would replay on a generator state of its own
(below), not on the seeded default generator.

Memory. The graphs of one generation (captured since the tensors they read were last replaced) share one private memory
pool: their temporaries live only during a replay and graphs never replay at once, and every input and output is a
tensor allocated outside the pool. `clear()` ends a generation, and the next capture opens a new pool: a pool must not
be captured into again once every graph that used it is gone. PyTorch's caching allocator counts the graphs using a pool
(`use_count`, dropped by each graph's destruction: `CUDAGraph::reset` -> `releasePool`), erases the pool only when an
`empty_cache` finds every block of it free (`release_cached_blocks`: `cudaMalloc_count == 0`), and refuses a capture
into a pool it still holds at count 0 (`create_or_incref_pool`: "it->second->use_count > 0 INTERNAL ASSERT FAILED at
CUDACachingAllocator.cpp"). Keeping the handle across `clear()`, as this module did, fails the first capture after a
`clear()` (a decoder's cache or state grew, or its weights moved) whenever a block of the old pool outlived its graphs:
on a lent H200, in item 4 of the GPU check and in the spider10 run, whose decoders then ran eagerly; vLLM (#28426) and
TensorRT-LLM (#16968) met the same assert by keeping a pool handle past its graphs. One such block is cuBLAS's
workspace: PyTorch makes one per stream at the stream's first matrix product and keeps it for the process
(`CublasHandlePool.cpp`, `setCublasWorkspace`), so a stream whose first product is captured puts its workspace in that
capture's pool for good. The warm-up therefore runs on the stream the capture then uses (`torch.cuda.graph(...,
stream=)`, one stream for every capture), which makes its workspaces (cuBLAS's, cuBLASLt's) outside any pool; the
warm-up used to run on a new side stream while the capture ran on `torch.cuda.graph`'s own.

The torch.cuda calls go through `CudaCapture` (a pool handle, the capture stream, the warm-up, the capture), which the
tests replace with the allocator's pool rules to check this on a CPU.

A capture that fails (an operation that cannot be captured, a CUDA call the capture forbids, no CUDA device) is
remembered in `error`, logged as a warning that names the key it was for (`extra={"graph_key": key}`), and every
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

__all__ = ["StepGraphs", "CudaCapture"]

logger = logging.getLogger(__name__)


class StepGraphs:
    """Replayed CUDA graphs of step functions, one per key (see the module docstring).

    Args:
        enabled: capture graphs (False: every step runs eagerly, as on a CPU).
        cuda: what makes the pools, the stream and the graphs (default `CudaCapture()`: torch.cuda's).
    """

    def __init__(self, enabled: bool, cuda: Any = None):
        self.enabled = enabled
        self.cuda = cuda if cuda is not None else CudaCapture()
        #: Why capture was given up (then every step runs eagerly), or None.
        self.error: str | None = None
        #: Graphs captured so far.
        self.captured = 0
        self._graphs: dict[Hashable, Any] = {}
        self._pool = None

    def clear(self) -> None:
        """Forget the graphs (the tensors they read were replaced); the next capture opens a new memory pool (a pool
        whose graphs are all gone cannot be captured into again: see the module docstring)."""
        self._graphs.clear()
        self._pool = None

    def release(self) -> None:
        """Forget the graphs and their memory pool (freed at the next `empty_cache`)."""
        self.clear()

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
                self._pool = None
                logger.warning("capturing the CUDA graph of %s failed, running its steps eagerly from now on: %s",
                               _describe(key), self.error, extra={"graph_key": key})
                return step
            self._graphs[key] = graph
            self.captured += 1
        return graph.replay

    def _capture(self, step: Callable[[], None]) -> Any:
        if self._pool is None:
            self._pool = self.cuda.pool()
        stream = self.cuda.stream()
        self.cuda.warm_up(step, stream)  # on the capture's stream: its workspaces are made here, in no pool
        return self.cuda.capture(step, self._pool, stream)


class CudaCapture:
    """The torch.cuda calls of `StepGraphs`: a new pool handle, the capture stream (one per device, as
    `torch.cuda.graph`'s own), a warm-up run on it, and a capture into a pool on it that leaves the generator, the
    stream and the garbage collector as they were (see the module docstring)."""

    _streams: dict[Any, Any] = {}

    def pool(self) -> Any:
        import torch

        return torch.cuda.graph_pool_handle()

    def stream(self) -> Any:
        import torch

        device = torch.cuda.current_device()
        if device not in self._streams:
            CudaCapture._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def warm_up(self, step: Callable[[], None], stream: Any) -> None:
        """Run `step` once on `stream`, ordered after and before the current stream's work."""
        import torch

        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            step()
        current.wait_stream(stream)

    def capture(self, step: Callable[[], None], pool: Any, stream: Any) -> Any:
        """`step` captured on `stream` into `pool`: a `torch.cuda.CUDAGraph`."""
        import gc

        import torch

        current = torch.cuda.current_stream()
        graph = torch.cuda.CUDAGraph()
        default = torch.cuda.default_generators[torch.cuda.current_device()]
        held = default.graphsafe_get_state()
        collecting = gc.isenabled()
        gc.disable()
        try:
            # What the capture marks (and, if it fails, leaves marked) is a private state, never the default one.
            default.graphsafe_set_state(torch.Generator(device=current.device))
            # Capture errors are this thread's alone (another thread's CUDA call, say a status reader, does not
            # break it).
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                step()
        finally:
            default.graphsafe_set_state(held)
            torch.cuda.set_stream(current)
            if collecting:
                gc.enable()
        return graph


def _describe(key: Hashable) -> str:
    """A graph's key in words: its fields when it has names (`GraphDecoder`'s: batch, window, sampled)."""
    fields = getattr(key, "_asdict", None)
    if fields is None:
        return f"key {key!r}"
    return ", ".join(f"{name} {value}" for name, value in fields().items())


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
