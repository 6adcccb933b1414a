"""How the dashboard writes numbers, percents (with their 95% intervals) and durations: one definition each.

Every function takes whatever a run's files hold (a value may be missing, None, NaN, a string) and never raises: a
value that is not a finite number prints as `MISSING` ("–").
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["MISSING", "as_float", "percent", "share", "interval", "rate_cell", "duration", "duration_words"]

#: What a value that is not there (or not a number) prints as.
MISSING = "–"


def as_float(value: Any) -> float | None:
    """A finite float, or None for anything that is not one (None, NaN, infinities, non-numeric strings, bools)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def percent(rate: Any) -> str:
    """A rate in [0, 1] as a whole percent: "43%"."""
    number = as_float(rate)
    return MISSING if number is None else f"{number:.0%}"


def share(rate: Any) -> str:
    """A rate as a percent with one decimal where it has one: 73.5% on 200 questions, 43% on 100."""
    number = as_float(rate)
    return MISSING if number is None else f"{100 * number:.1f}".rstrip("0").rstrip(".") + "%"


def interval(ci: Any) -> str:
    """A 95% interval `[low, high]` as "30%–57%"."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return MISSING
    low, high = as_float(ci[0]), as_float(ci[1])
    return MISSING if low is None or high is None else f"{low:.0%}–{high:.0%}"


def rate_cell(rate: Any, ci: Any, n: Any) -> str:
    """A table cell: "43% [30%–57%] (40)", the rate, its interval when known and the episodes it was measured on."""
    if as_float(rate) is None:
        return MISSING
    bounds = interval(ci)
    return f"{percent(rate)}{'' if bounds == MISSING else f' [{bounds}]'} ({n})"


def duration(seconds: Any) -> str:
    """A clock duration: "2m 05s", "1h 02m 05s"."""
    number = as_float(seconds)
    if number is None or number < 0:
        return MISSING
    hours, rest = divmod(int(round(number)), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def duration_words(seconds: float) -> str:
    """A duration in words, rounded: "10 minutes", "1 minute", "45 s" (at least 1 s)."""
    if seconds >= 60:
        minutes = max(1, round(seconds / 60))
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{max(1, round(seconds))} s"
