"""GRPO records as a run writes them (`training.callbacks.RunRecorder`), for the health tests: a run that collapses
and one that learns, with the health metrics per step and a validation panel every 5 steps.

The figures follow issue 45's measurements: grad norms of 0.02-0.04 a step, sampled entropy near 0.6 nats/token,
KL from the start in hundredths of a nat by step 10, a 40-question validation panel.
"""

from __future__ import annotations

from training.callbacks import RunRecorder
from training.health import ENTROPY_KEY, KL_KEY, VALIDATION_SPLIT
from training.run_dir import RunDir

PANEL = [f"q{i:03d}" for i in range(40)]
#: The panel's outcomes at step 0: the first 18 questions right.
START = [i < 18 for i in range(40)]
STEPS = 20


def validation_line(step: int, correct: list[bool]) -> dict:
    return {"phase": "grpo", "split": VALIDATION_SPLIT, "step": step, "success_rate": sum(correct) / len(correct),
            "n_episodes": len(correct), "question_ids": list(PANEL), "correct": list(correct), "avg_reward": 0.0,
            "avg_steps": 3.0, "time": 1_700_000_000.0 + step}


def flipped(lost: int, gained: int) -> list[bool]:
    """The start's outcomes with the first `lost` right questions wrong and the first `gained` wrong ones right."""
    correct = list(START)
    for i in range(lost):
        correct[i] = False
    for i in range(gained):
        correct[18 + i] = True
    return correct


def write_grpo_run(run: RunDir, *, collapse: bool) -> None:
    """GRPO's metrics and validation evals of a 20-step run through a real `RunRecorder`: with `collapse`, the
    entropy climbs from 0.6 to 1.5 nats/token, the grad norm spikes at step 16 and validation loses 10 questions
    (gaining 1); without, all stay steady and validation gains 4 questions, losing 1."""
    recorder = RunRecorder(run)
    recorder.append("evals", validation_line(0, START))
    for step in range(1, STEPS + 1):
        grad = 0.02 + 0.01 * (step % 3)
        entropy = 0.6 + (0.05 * step if collapse else 0.01 * (step % 2))
        if collapse and step == 16:
            grad = 0.4
        record = {"phase": "grpo", "step": step, "time": 1_700_000_000.0 + step, "reward": 0.3,
                  "reward_std": 0.4 - (0.015 * step if collapse else 0.0), "grad_norm": grad,
                  "groups_mixed_success_frac": 0.5, ENTROPY_KEY: entropy}
        if step % 5 == 0:
            record[KL_KEY] = (0.006 if collapse else 0.0004) * step
        recorder.append("metrics", record)
        if step % 5 == 0:
            share = step / STEPS
            outcomes = flipped(round(10 * share), round(share)) if collapse else flipped(round(share), round(4 * share))
            recorder.append("evals", validation_line(step, outcomes))
