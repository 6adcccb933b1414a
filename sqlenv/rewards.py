"""The three reward layers: operational (every step), progress (potential-based shaping on QUERY results)
and terminal (a correct ANSWER). Every constant lives in `RewardConfig`.

Progress compares a query result with the gold result. It is cheap on the hot path: the gold side is
summarised once per episode (`GoldProfile`) and each result is reduced to a flat value set in one pass.
"""

from __future__ import annotations

import bisect
import math
from itertools import chain
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass
class RewardConfig:
    """Every reward constant of SQLEnv. Defaults follow the design; the oracle totals about 1.1-1.3.

    Args:
        executed_ok: Layer 1 bonus when the action ran without error (default +0.02).
        new_info: Layer 1 bonus when it revealed something new: the first DESCRIBE/SAMPLE of a table or a
            QUERY result not seen before in the episode (default +0.01).
        repeat_penalty: Layer 1 penalty for repeating an earlier action (same type and normalised argument;
            SQL by `sandbox.normalize_sql`: case, spacing and comments ignored) (default -0.03).
        step_cost: Layer 1 cost paid by every step, so wandering is never free (default -0.02).
        progress_scale: Layer 2 shaping weight: reward = progress_scale * (Phi(now) - Phi(before)), where Phi
            is the best-so-far progress binned to `progress_bins` (default 0.15). Potential-based, so it
            cannot change which policy is optimal.
        progress_bins: Number of equal bins of the progress potential (default 4 → {0, .25, .5, .75, 1}).
        weight_cardinality: Progress weight of row-count similarity 1 - |n - n_gold| / max(n, n_gold, 1)
            (default 0.25).
        weight_overlap: Progress weight of the Jaccard overlap of the flattened value sets (default 0.50).
        weight_numeric: Progress weight of numeric closeness on a log scale (default 0.25).
        numeric_decades: Log10 distance at which numeric closeness reaches 0 (default 1.0: a value ten times
            off scores 0).
        dense_min: Lower clip of a step's dense (operational + progress) reward (default -0.10).
        dense_max: Upper clip of a step's dense reward (default +0.15).
        correct_answer: Layer 3 reward for a correct ANSWER (default 1.0). Wrong answers and running out of
            budget earn 0.
        max_numbers: Most distinct numbers per side used for numeric closeness (default 256), bounding cost.
    """

    executed_ok: float = 0.02
    new_info: float = 0.01
    repeat_penalty: float = -0.03
    step_cost: float = -0.02
    progress_scale: float = 0.15
    progress_bins: int = 4
    weight_cardinality: float = 0.25
    weight_overlap: float = 0.50
    weight_numeric: float = 0.25
    numeric_decades: float = 1.0
    dense_min: float = -0.10
    dense_max: float = 0.15
    correct_answer: float = 1.0
    max_numbers: int = 256

    def __post_init__(self) -> None:
        if self.dense_min > self.dense_max:
            raise ValueError(f"RewardConfig.dense_min ({self.dense_min}) must be <= dense_max ({self.dense_max})")
        if self.progress_bins < 1 or self.max_numbers < 1 or self.numeric_decades <= 0:
            raise ValueError("RewardConfig.progress_bins and max_numbers must be >= 1, numeric_decades > 0")
        if min(self.weight_cardinality, self.weight_overlap, self.weight_numeric) < 0:
            raise ValueError("RewardConfig progress weights must be >= 0")

    def operational(self, *, ok: bool, new_info: bool, repeat: bool) -> float:
        """Layer 1 reward of one step."""
        value = self.step_cost
        if ok:
            value += self.executed_ok
        if ok and new_info:
            value += self.new_info
        if repeat:
            value += self.repeat_penalty
        return value

    def potential(self, progress: float) -> float:
        """Phi: progress binned down to a multiple of 1/progress_bins (tiny float error tolerated)."""
        bins = max(1, self.progress_bins)
        return min(1.0, math.floor(progress * bins + 1e-9) / bins)

    def shaping(self, best_before: float, best_now: float) -> float:
        """Layer 2 reward: progress_scale * (Phi(now) - Phi(before))."""
        return self.progress_scale * (self.potential(best_now) - self.potential(best_before))

    def clip_dense(self, operational: float, progress: float) -> tuple[float, float]:
        """Clip operational + progress into [dense_min, dense_max]; the progress part absorbs the cut."""
        op = min(max(operational, self.dense_min), self.dense_max)
        total = min(max(op + progress, self.dense_min), self.dense_max)
        return op, total - op


# ---------------------------------------------------------------------------------------- progress score

def _norm_float(value: float) -> Any:
    return round(value, 6) if math.isfinite(value) else str(value)


def flatten_values(rows: Iterable[tuple]) -> set:
    """The set of non-NULL values in a result; floats rounded to 6 decimals (3 == 3.0 already in Python).

    Both sides of a comparison come from the same database, so text is compared as stored. This is the
    progress hot path: the set is built in C and only floats get a Python-level touch.
    """
    values = set(chain.from_iterable(rows))
    values.discard(None)
    if float not in set(map(type, values)):  # C-level check: most results hold no float at all
        return values
    floats = [v for v in values if type(v) is float]
    if floats:
        values.difference_update(floats)
        values.update(_norm_float(v) for v in floats)
    return values


def _slog(x: float) -> float:
    return math.copysign(math.log10(1.0 + abs(x)), x)


@dataclass
class GoldProfile:
    """What progress scoring needs from the gold result, computed once per episode."""

    n_rows: int
    values: set
    numbers: list  # sorted signed-log numbers (capped)
    columns: list = field(default_factory=list)  # the gold result's column names (for the verifier)

    @classmethod
    def from_rows(cls, rows: list[tuple], n_rows: int | None = None, max_numbers: int = 256) -> "GoldProfile":
        values = flatten_values(rows)
        return cls(n_rows if n_rows is not None else len(rows), values, _numbers(values, max_numbers))


def _numbers(values: set, cap: int) -> list:
    nums = sorted(_slog(v) for v in values if type(v) is float or type(v) is int)
    if len(nums) > cap:  # keep an even spread
        step = len(nums) / cap
        nums = [nums[int(i * step)] for i in range(cap)]
    return nums


def _closeness(gold_nums: list, pred_nums: list, decades: float) -> float:
    """Mean over gold numbers of the best 1 - |slog(g) - slog(p)| / decades (floored at 0)."""
    total = 0.0
    for g in gold_nums:
        i = bisect.bisect_left(pred_nums, g)
        best = math.inf
        if i < len(pred_nums):
            best = pred_nums[i] - g
        if i > 0:
            best = min(best, g - pred_nums[i - 1])
        total += max(0.0, 1.0 - best / decades)
    return total / len(gold_nums)


def progress_score(rows: list[tuple], n_rows: int, gold: GoldProfile, config: RewardConfig | None = None) -> float:
    """How close a query result is to the gold result, in [0, 1] (1 for the gold result itself).

    0.25 cardinality similarity + 0.50 Jaccard overlap of flattened value sets + 0.25 numeric closeness.
    When neither side has numbers, the numeric term equals the overlap (nothing numeric to be close about).
    """
    config = config or RewardConfig()
    values = flatten_values(rows)
    if n_rows == gold.n_rows and values == gold.values:
        return 1.0  # the gold result itself (the common case for a solved question): skip the arithmetic
    cardinality = 1.0 - abs(n_rows - gold.n_rows) / max(n_rows, gold.n_rows, 1)
    union = len(values | gold.values)
    overlap = len(values & gold.values) / union if union else 1.0
    if gold.numbers:
        pred_nums = _numbers(values, config.max_numbers)
        numeric = _closeness(gold.numbers, pred_nums, config.numeric_decades) if pred_nums else 0.0
    elif any(type(v) is float or type(v) is int for v in values):
        numeric = 0.0
    else:
        numeric = overlap
    score = (config.weight_cardinality * cardinality + config.weight_overlap * overlap
             + config.weight_numeric * numeric)
    total_weight = config.weight_cardinality + config.weight_overlap + config.weight_numeric
    return max(0.0, min(1.0, score / total_weight if total_weight else 0.0))
