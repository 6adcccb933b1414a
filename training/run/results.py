"""What a run measured, and on what: its headline result (`final_measure`) and its last periodic eval, each a
`Measured` that says which model was measured, how, and on how many questions of which split.

A run records two kinds of success, on different questions: the final comparison (the trained model on
`comparison_episodes` eval questions) and the periodic evals during training (the model at that step on
`eval_episodes` of them). `python -m training.runs list` and the dashboard's Runs tab pick the headline the same
way and label it in the same words, so a bare "success 74%" beside "75%" never reads as a contradiction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Measured", "comparison_measure", "final_measure", "fmt_rate", "last_eval_measure"]


@dataclass(frozen=True)
class Measured:
    """One success measurement of a run (success and EX, fractions or None), with what was measured: which model,
    how, on how many questions of which split (module docstring)."""

    success: float | None
    execution: float | None
    model: str
    how: str
    questions: int | None
    split: str

    @property
    def label(self) -> str:
        """e.g. "trained model · final comparison · 200 eval questions": the Runs table and the run detail say it
        in the same words."""
        count = f"{self.questions} " if self.questions is not None else ""
        return f"{self.model} · {self.how} · {count}{self.split} questions"

    def rates(self) -> str:
        return f"success {fmt_rate(self.success)} · EX {fmt_rate(self.execution)}"


def fmt_rate(rate: Any) -> str:
    return f"{rate:.0%}" if isinstance(rate, (int, float)) and not isinstance(rate, bool) else "–"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def last_eval_measure(evals: list[Any], split: str) -> Measured | None:
    """The last periodic eval on `split` (what `evals.jsonl` records every `eval_every` steps and at the end) that
    measured something: an eval that failed (`error`) measured nothing."""
    record = next((e for e in reversed(evals) if isinstance(e, dict) and e.get("split") == split
                   and not e.get("error")), None)
    if record is None:
        return None
    phase = str(record["phase"]).upper() if record.get("phase") else ""
    step = record.get("step", "?")
    n = record.get("n_episodes")
    return Measured(_number(record.get("success_rate")), _number(record.get("execution_accuracy")),
                    f"model at {phase + ' ' if phase else ''}step {step}", "periodic eval",
                    n if isinstance(n, int) else None, split)


def comparison_measure(summary: dict[str, Any] | None, split: str) -> Measured | None:
    """The trained model in the run's final comparison (`comparison.jsonl`'s summary)."""
    trained = summary.get("trained") if isinstance(summary, dict) else None
    if not isinstance(trained, dict):
        return None
    n = trained.get("n_episodes", summary.get("n_episodes"))
    return Measured(_number(trained.get("success_rate")), _number(trained.get("execution_accuracy")),
                    "trained model", "final comparison", n if isinstance(n, int) else None,
                    str(summary.get("split") or split))


def final_measure(summary: dict[str, Any] | None, evals: list[Any], split: str) -> Measured | None:
    """A run's headline result (`python -m training.runs list` and the Runs tab): the final comparison,
    else (no comparison yet, or none wanted) the last periodic eval on the eval split."""
    return comparison_measure(summary, split) or last_eval_measure(evals, split)
