"""A bench-only probe of the server's event loop: how late it wakes, and what the process did meanwhile.

Off unless the server's environment names a file in `SQLENV_LOOP_PROBE_FILE` (the soak, `bench/security/soak.py`, sets
it); nothing is served over HTTP. When on, a task on the event loop sleeps `TICK_S` (50 ms) again and again and
writes one JSON line per `WINDOW_S` (1 s) to that file:

- `t0`, `t1`: the window (`time.monotonic()`, one clock for every process of the machine, so a client can line
  its own timings up with these);
- `lag_max_s`, `lag_at`: how late the latest sleep woke at most, and when that wake-up came;
- `loop_cpu_s`, `loop_runq_s`: the event loop thread's time on a core and waiting for one (`schedstat` of the
  thread): a loop that woke late but neither ran nor waited for a core was waiting for the interpreter lock
  (or blocked in a call);
- `proc_cpu_s`: the whole process's CPU time (all threads);
- `gc_s`, `gc_max_s`, `gc_gen2`: time spent in garbage collections (all threads; a collection holds the
  interpreter lock), the longest one, and how many full collections;
- `threads`: threads alive; `steps_max`, `steps_python_max`: the most steps in flight and the most holding a
  Python-work slot (`sqlenv.server.environment.step_activity`), sampled at each tick; `steps_unslotted_max`: the
  most steps in flight at one tick without a slot (running a statement, opening a database, or waiting for a slot);
- `health_max_s`, `health_at`: the longest a `/health` request took in the app (from its head parsed to its
  reply sent: `HealthTimer`), and when it arrived.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

PROBE_FILE_ENV = "SQLENV_LOOP_PROBE_FILE"
TICK_S = 0.05
WINDOW_S = 1.0


def probe_path() -> Path | None:
    """The file named by `SQLENV_LOOP_PROBE_FILE`, or None (the probe is off)."""
    value = os.environ.get(PROBE_FILE_ENV, "")
    return Path(value) if value else None


def _schedstat(tid: int) -> tuple[float, float]:
    """(seconds on a core, seconds waiting on a run queue) of thread `tid`, or (nan, nan) without schedstats."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return float("nan"), float("nan")


class _GcTimer:
    """Times every garbage collection through `gc.callbacks` (a collection runs holding the interpreter lock, so
    one start/stop pair is never interleaved with another)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.total = 0.0
        self.longest = 0.0
        self.full = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        spent = time.perf_counter() - self.started
        self.total += spent
        self.longest = max(self.longest, spent)
        self.full += info.get("generation") == 2

    def take(self) -> tuple[float, float, int]:
        out = (self.total, self.longest, self.full)
        self.total = self.longest = 0.0
        self.full = 0
        return out


class HealthTimer:
    """ASGI middleware (added only with the probe on): times each `/health` request inside the app, from its
    head parsed to its reply sent, keeping the longest of the current window."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != "/health":
            await self.app(scope, receive, send)
            return
        arrived = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            spent = time.monotonic() - arrived
            if spent > HEALTH[0]:
                HEALTH[:] = [spent, arrived]


HEALTH = [0.0, 0.0]  # the current window's longest /health in the app, and when it arrived


async def run_probe(path: Path, activity: Callable[[], tuple[int, int]] | None = None) -> None:
    """Write one line per window to `path` until cancelled (see the module's docstring)."""
    tid = threading.get_native_id()
    timer = _GcTimer()
    gc.callbacks.append(timer)
    try:
        with open(path, "a", encoding="utf-8") as out:
            while True:
                t0 = time.monotonic()
                cpu0, runq0 = _schedstat(tid)
                proc0 = time.process_time()
                lag_max, lag_at, steps_max, python_max, unslotted_max = 0.0, t0, 0, 0, 0
                while time.monotonic() - t0 < WINDOW_S:
                    asked = time.monotonic()
                    await asyncio.sleep(TICK_S)
                    woke = time.monotonic()
                    if woke - asked - TICK_S > lag_max:
                        lag_max, lag_at = woke - asked - TICK_S, woke
                    if activity is not None:
                        steps, python = activity()
                        steps_max, python_max = max(steps_max, steps), max(python_max, python)
                        unslotted_max = max(unslotted_max, steps - python)
                t1 = time.monotonic()
                cpu1, runq1 = _schedstat(tid)
                gc_s, gc_max, gc_full = timer.take()
                health_max, health_at = HEALTH
                HEALTH[:] = [0.0, 0.0]
                record: dict[str, Any] = {
                    "t0": round(t0, 4), "t1": round(t1, 4), "lag_max_s": round(lag_max, 4), "lag_at": round(lag_at, 4),
                    "loop_cpu_s": round(cpu1 - cpu0, 4), "loop_runq_s": round(runq1 - runq0, 4),
                    "proc_cpu_s": round(time.process_time() - proc0, 4), "gc_s": round(gc_s, 4),
                    "gc_max_s": round(gc_max, 4), "gc_gen2": gc_full, "threads": threading.active_count(),
                    "steps_max": steps_max, "steps_python_max": python_max, "steps_unslotted_max": unslotted_max,
                    "health_max_s": round(health_max, 4),
                    "health_at": round(health_at, 4)}
                out.write(json.dumps(record) + "\n")
                out.flush()
    finally:
        gc.callbacks.remove(timer)
