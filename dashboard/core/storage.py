"""Where the dashboard keeps its runs, so that they survive a HuggingFace Space's restarts.

A Space's own disk is wiped whenever it restarts; a Space with persistent storage mounts a disk at `/data`
that is kept. So on a Space the runs go under `/data/runs` when `/data` is there and writable. An explicit
choice always wins: `--runs-dir`, then `$SQLENV_RUNS_DIR`; everywhere else it is `runs/`, as the CLI uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

PERSISTENT_DIR = Path("/data")  # where a Space mounts its persistent storage


def choose_runs_root(runs_dir: Path | None = None, env: Mapping[str, str] | None = None,
                     persistent_dir: Path = PERSISTENT_DIR) -> Path:
    """The runs folder: `runs_dir` if given, else `$SQLENV_RUNS_DIR`, else `<persistent_dir>/runs` on a Space
    (`SPACE_ID` set) whose persistent disk is mounted and writable, else `runs`.

    Args:
        runs_dir: an explicit folder (the app's `--runs-dir`).
        env: the environment to read (default `os.environ`).
        persistent_dir: where a Space's persistent storage is mounted (default `/data`).
    """
    env = os.environ if env is None else env
    if runs_dir is not None:
        return Path(runs_dir)
    if env.get("SQLENV_RUNS_DIR"):
        return Path(env["SQLENV_RUNS_DIR"])
    if env.get("SPACE_ID") and persistent_dir.is_dir() and os.access(persistent_dir, os.W_OK):
        return persistent_dir / "runs"
    return Path("runs")
