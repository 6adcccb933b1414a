"""The run record's names, defined once: the phases a run's status.json names in the order a run plays them, its
statuses, its record files, and where runs live and what they are called.

`PHASES` is every phase `status.json`'s "phase" takes while a run works (a run may skip some: no warm start, no
zero-shot eval); `TRAINER_PHASES` the ones whose trainers write metrics and evals (each line carries its phase).
Before the first of them a run reads "queued", then "resuming" when it resumes; neither is a phase of the plan.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

__all__ = ["PHASES", "TRAINER_PHASES", "LOADING_MODEL", "ZERO_SHOT_EVAL", "SFT", "BASE_EVAL", "GRPO", "SAVING",
           "COMPARISON", "STATUSES", "FINISHED_STATUSES", "INTERRUPTED", "RESUMABLE_STATUSES", "JSONL_FILES",
           "RUN_ID_PATTERN", "new_run_id", "default_runs_root"]

LOADING_MODEL = "loading model"
ZERO_SHOT_EVAL = "zero-shot eval"
SFT = "sft"  # the warm start
BASE_EVAL = "base eval"
GRPO = "grpo"
SAVING = "saving"  # final/ written
COMPARISON = "comparison"

#: Every phase of a run, in run order.
PHASES = (LOADING_MODEL, ZERO_SHOT_EVAL, SFT, BASE_EVAL, GRPO, SAVING, COMPARISON)

#: The phases whose trainers write metrics and evals, in run order.
TRAINER_PHASES = (SFT, GRPO)

STATUSES = ("queued", "running", "completed", "failed", "stopped")
FINISHED_STATUSES = ("completed", "failed", "stopped")
#: What a reader reports for a queued/running run whose writer is gone (never written: see
#: `training.run.directory.live_status`).
INTERRUPTED = "interrupted"
#: Runs that `python -m training.train --resume` can continue.
RESUMABLE_STATUSES = ("stopped", "failed", INTERRUPTED)

#: The run's JSONL files (`<name>.jsonl`), one record a line.
JSONL_FILES = ("metrics", "evals", "transcripts", "comparison")

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"


def default_runs_root() -> Path:
    """`$SQLENV_RUNS_DIR`, or `runs/` in the current directory."""
    return Path(os.environ.get("SQLENV_RUNS_DIR", "runs"))
