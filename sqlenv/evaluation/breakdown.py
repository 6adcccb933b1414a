"""Success and execution accuracy broken down overall, per hardness and per database, with 95% intervals.

`breakdown(episodes)` reads transcripts (the format of `sqlenv.transcript`) and returns::

    {"overall":  CELL,
     "hardness": {"easy": CELL, "medium": CELL, "hard": CELL, "extra": CELL, <other labels>: CELL},
     "database": {<database>: CELL, ...}}

    CELL = {"n": episodes, "success_rate": float, "success_ci": [low, high],
            "n_execution": episodes whose EX is known, "execution_accuracy": float | None,
            "execution_ci": [low, high] | None}

Hardness levels come in Spider's order, then any other label (the built-in dataset's own levels) sorted; databases
sorted by name. An episode's EX is its transcript's `execution_match`; transcripts without one (written before EX
existed, or an episode that never ended) are left out of the EX rate and counted apart (`n_execution`), so old run
directories still read. The interval is Wilson's score interval: right at the 0% and 100% ends that small cells
hit, where the normal approximation collapses to a point.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from sqlenv.data.difficulty import HARDNESS_LEVELS

__all__ = ["wilson_interval", "rate_cell", "breakdown", "Z_95"]

#: The standard normal quantile of a two-sided 95% interval.
Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a rate of `successes` out of `n` (default 95%); (0.0, 1.0) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 and n the bound is exactly 0 or 1; rounding must not leave the observed rate outside its interval.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def _rate(values: list[bool]) -> tuple[float | None, list[float] | None]:
    if not values:
        return None, None
    k = sum(values)
    low, high = wilson_interval(k, len(values))
    return k / len(values), [round(low, 4), round(high, 4)]


def rate_cell(episodes: Iterable[dict]) -> dict[str, Any]:
    """The CELL of a group of transcripts (see the module docstring)."""
    success, execution = [], []
    for ep in episodes:
        success.append(bool(ep.get("correct")))
        match = ep.get("execution_match")
        if isinstance(match, bool):
            execution.append(match)
    success_rate, success_ci = _rate(success)
    execution_accuracy, execution_ci = _rate(execution)
    return {"n": len(success), "success_rate": success_rate if success_rate is not None else 0.0,
            "success_ci": success_ci or [0.0, 1.0], "n_execution": len(execution),
            "execution_accuracy": execution_accuracy, "execution_ci": execution_ci}


def _hardness_order(label: str) -> tuple:
    return (HARDNESS_LEVELS.index(label), "") if label in HARDNESS_LEVELS else (len(HARDNESS_LEVELS), label)


def breakdown(episodes: Iterable[dict]) -> dict[str, Any]:
    """Overall, per-hardness and per-database cells of `episodes` (see the module docstring)."""
    episodes = [ep for ep in episodes if isinstance(ep, dict)]
    by_hardness: dict[str, list[dict]] = {}
    by_database: dict[str, list[dict]] = {}
    for ep in episodes:
        by_hardness.setdefault(str(ep.get("difficulty") or "unknown"), []).append(ep)
        by_database.setdefault(str(ep.get("database") or "unknown"), []).append(ep)
    return {
        "overall": rate_cell(episodes),
        "hardness": {k: rate_cell(by_hardness[k]) for k in sorted(by_hardness, key=_hardness_order)},
        "database": {k: rate_cell(by_database[k]) for k in sorted(by_database)},
    }
