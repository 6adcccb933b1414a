"""Checks on values from a page: once the app is public they come from anyone, through any HTTP client.

Visitors' events (Play, Compare, Runs) take names and text. A name must name something that exists under
`data/` or `runs/` (never a path: nothing else on disk is read), text has a length limit, and a refused value
is quoted back cut short. Each check raises `InputRefused` with the message the page shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The sandbox refuses SQL longer than this (SandboxSettings.max_sql_chars); no action argument needs more.
MAX_ARGUMENT_CHARS = 20_000
MAX_NAME_CHARS = 200  # dataset, split, question and run names
MAX_OVERLAY_RUNS = 12  # runs drawn on one overlay chart


class InputRefused(ValueError):
    """A value from the page was refused; the message says why, quoting the value cut short."""


def quote(value: Any, limit: int = 60) -> str:
    """`value` as repr, cut to about `limit` characters (a refused 1 MB value is not echoed back whole)."""
    text = repr(value) if isinstance(value, str) else repr(type(value).__name__)
    return text if len(text) <= limit else text[: limit - 1] + "…'"


def text(value: Any, label: str, limit: int = MAX_ARGUMENT_CHARS) -> str:
    """`value` as a string ('' for None) of at most `limit` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputRefused(f"{label} must be text, not {type(value).__name__}.")
    if len(value) > limit:
        raise InputRefused(f"{label} is too long: {len(value):,} characters (at most {limit:,}).")
    return value


def name(value: Any, label: str) -> str:
    """A short, non-empty name (a dataset, split, question or run)."""
    value = text(value, label, MAX_NAME_CHARS).strip()
    if not value:
        raise InputRefused(f"{label} is empty.")
    return value


def dataset_source(value: Any, data_root: Path | None) -> str:
    """The dataset to open for a dataset name from the page: `builtin`, or the folder of a dataset prepared
    under the data folder. Paths and unknown names are refused (a visitor reads nothing else on disk)."""
    from sqlenv.datasets import BUILTIN_NAME, list_datasets, prepare_hint

    value = name(value, "Dataset")
    if value == BUILTIN_NAME:
        return value
    try:
        prepared = {info.name: info.root for info in list_datasets(data_root)}
    except OSError:
        prepared = {}
    if value not in prepared:
        known = [BUILTIN_NAME] + sorted(n for n in prepared if n != BUILTIN_NAME)
        hint = prepare_hint(value, data_root)  # a Spider preset not prepared yet: the command that prepares it
        if hint:
            raise InputRefused(f"Dataset {quote(value)} is not prepared on this server ({hint}): pick one of "
                               f"{', '.join(known)}.")
        raise InputRefused(f"Unknown dataset {quote(value)}: pick one of {', '.join(known)}.")
    return str(prepared[value])


def run_names(values: Any, limit: int = MAX_OVERLAY_RUNS) -> list[str]:
    """A list of at most `limit` run names (each still goes through the run cache's own checks)."""
    if values is None:
        return []
    if not isinstance(values, (list, tuple)):
        raise InputRefused("Runs must be a list of run names.")
    if len(values) > limit:
        raise InputRefused(f"Too many runs: {len(values)} (at most {limit} on one chart).")
    return [name(v, "Run") for v in values]
