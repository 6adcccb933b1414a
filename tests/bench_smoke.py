"""Runs a bench script in its smallest form for `test_bench_smoke_a.py` and `test_bench_smoke_b.py` (a module of
its own: both files use it, and pytest-xdist gives each file to one worker)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: What a test's environment may set that would send a bench's files elsewhere than its own temp folders.
DROPPED = ("OUT", "SQLENV_RUNS_DIR", "SQLENV_DATA_DIR", "SQLENV_DECODER")


def run_bench(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """`python bench/<script> ARGS` from the repository root: asserts it exits 0 and that its last stdout line is
    one JSON object, and returns that object. One torch thread (two CI workers share two cores); its wall time and
    CPU time (its processes', waited for) are printed: `pytest -s` shows them."""
    full_env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    full_env.update(OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1", PYTHONUNBUFFERED="1", **(env or {}))
    started, cpu = time.monotonic(), _children_cpu()
    done = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    print(f"bench/{script}: {time.monotonic() - started:.1f} s, {_children_cpu() - cpu:.1f} s of CPU")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output\n{done.stderr[-3000:]}"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict), lines[-1][:500]
    return figures


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
