"""Which weights a run kept, and why, in words: what the Runs tab and Compare say of `keep_best`.

A run with a validation panel keeps its best validated weights, the start included (`keep_best`). Two records say
which (`training.run.directory`):

- status.json's `keep_best`, rewritten at each validation eval: `{"metric_for_best_model", "best_step",
  "best_metric", "start_metric", "last_step", "last_metric", "kept": "start" | "best" | "last", "reason"}`;
- the comparison summary's `trained_weights`, `{"step", "kept", "reason"}`: the weights the final comparison played.

Pure Python; odd records (missing or mistyped fields) read as None rather than raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KeptWeights", "kept_weights", "KEPT_CHOICES"]

#: What `kept` may say: the weights GRPO started from, its best validated step, or its last step.
KEPT_CHOICES = ("start", "best", "last")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rate(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class KeptWeights:
    """The weights a run kept (`kept`: start, best or last), at which GRPO step, why, and (from status.json) the
    validation figures it chose by."""

    kept: str
    step: int | None
    reason: str
    metric: str = "validation_success"
    start_metric: float | None = None
    best_step: int | None = None
    best_metric: float | None = None
    last_step: int | None = None
    last_metric: float | None = None

    @property
    def what(self) -> str:
        """e.g. "the start (step 0)", "step 12, the best on validation", "the last step, 20"."""
        at = f"step {self.step}" if self.step is not None else "its step"
        if self.kept == "start":
            return f"the start ({at})" if self.step is not None else "the start"
        if self.kept == "best":
            return f"{at}, the best on {self.metric_words}"
        return f"the last step, {self.step}" if self.step is not None else "the last step"

    @property
    def metric_words(self) -> str:
        """The metric as a page says it: "validation" for validation success."""
        return "validation" if self.metric == "validation_success" else self.metric.replace("_", " ")

    def figures(self) -> str:
        """The figures behind the choice, when status.json gave them: "Validation success: 45% at the start, best
        52% at step 12, last 48% at step 20" ("" when it gave none)."""
        parts = []
        if self.start_metric is not None:
            parts.append(f"{_fmt(self.start_metric, self.metric)} at the start")
        if self.best_metric is not None and self.best_step not in (None, 0):  # best at step 0: the start
            parts.append(f"best {_fmt(self.best_metric, self.metric)} at step {self.best_step}")
        if self.last_metric is not None and self.last_step is not None and self.last_step != self.best_step:
            parts.append(f"last {_fmt(self.last_metric, self.metric)} at step {self.last_step}")
        name = "Validation success" if self.metric == "validation_success" else self.metric.replace("_", " ")
        return f"{name}: {', '.join(parts)}" if parts else ""

    def text(self, final: bool = True) -> str:
        """What a page says: "Kept step 12, the best on validation — <reason>. Validation success: 45% at the start,
        best 52% at step 12, last 48% at step 20." While the run trains (`final` False) it is the choice so far."""
        lead = "Kept" if final else "So far keep_best keeps"
        text = f"{lead} {self.what}" + (f" — {self.reason.rstrip('.')}." if self.reason else ".")
        figures = self.figures()
        return f"{text} {figures}." if figures else text


def _fmt(value: float, metric: str) -> str:
    return f"{value:.0%}" if "success" in metric and 0.0 <= value <= 1.0 else f"{value:.3g}"


def kept_weights(record: Any) -> KeptWeights | None:
    """A `KeptWeights` from status.json's `keep_best` or the comparison summary's `trained_weights` (module
    docstring), or None when `record` is absent or does not say which weights were kept."""
    if not isinstance(record, dict) or record.get("kept") not in KEPT_CHOICES:
        return None
    kept = record["kept"]
    reason = record.get("reason") if isinstance(record.get("reason"), str) else ""
    best, last = _int(record.get("best_step")), _int(record.get("last_step"))
    step = _int(record.get("step"))
    if step is None:  # status.json names the kept step by what was kept
        step = {"start": 0, "best": best, "last": last}[kept]
    metric = record.get("metric_for_best_model")
    return KeptWeights(kept=kept, step=step, reason=reason.strip(),
                       metric=metric if isinstance(metric, str) and metric else "validation_success",
                       start_metric=_rate(record.get("start_metric")), best_step=best,
                       best_metric=_rate(record.get("best_metric")), last_step=last,
                       last_metric=_rate(record.get("last_metric")))
