"""Giving freed memory back to the system (glibc only; elsewhere these do nothing).

A process that runs many sandboxes on many threads (the server's sessions, the dashboard's Play episodes) frees
large blocks all the time: SQLite's in-memory temporary files grow by doubling, results are megabytes. Two glibc
behaviours keep that memory in the process after it is freed:

- each thread gets an arena that glibc does not shrink by itself: `malloc_trim(0)` returns its free pages;
- glibc's mmap threshold is dynamic: each time a mapped block is freed the threshold rises to its size (up to 32
  MiB), so later blocks of that size come from the arenas instead of their own mappings, where they fragment and
  stay. `fix_mmap_threshold` sets it once, which also turns the adjustment off, so big blocks keep their own
  mappings and go back to the system when freed. Measured in the soak (`bench/security/soak.py`, 180 s, 64 honest + 64
  hostile sessions): server RSS at rest after the soak 794 MB without it, 248 MB with it; peak 1,409 → 728 MB.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

__all__ = ["MMAP_THRESHOLD_BYTES", "malloc_trim", "fix_mmap_threshold"]

#: Blocks from this size up get a mapping of their own (returned to the system when freed).
MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def _libc() -> Any:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    return getattr(_libc(), "malloc_trim", None)


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap threshold to `nbytes` for this process (and stop its dynamic adjustment); False where the
    C library has no `mallopt`."""
    mallopt = getattr(_libc(), "mallopt", None)
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, int(nbytes)))
