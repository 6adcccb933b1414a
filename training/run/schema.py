"""The run record's names, defined once: the phases a run's status.json names, in the order a run plays them.

`PHASES` is every phase `status.json`'s "phase" takes while a run works (a run may skip some: no warm start, no
zero-shot eval); `TRAINER_PHASES` the ones whose trainers write metrics and evals (each line carries its phase).
Before the first of them a run reads "queued", then "resuming" when it resumes; neither is a phase of the plan.
"""

from __future__ import annotations

__all__ = ["PHASES", "TRAINER_PHASES", "LOADING_MODEL", "ZERO_SHOT_EVAL", "SFT", "BASE_EVAL", "GRPO", "SAVING",
           "COMPARISON"]

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
