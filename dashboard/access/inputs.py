"""Checks on values from a page: once the app is public they come from anyone, through any HTTP client.

Visitors' events (Play, Compare, Runs) take names and text. A name must name something that exists under
`data/` or `runs/` (never a path: nothing else on disk is read), text has a length limit, and a refused value
is quoted back cut short. Each check raises `InputRefused` with the message the page shows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sqlenv.data.datasets import BUILTIN_NAME, list_datasets, prepare_hint

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


# ------------------------------------------------------------------------------ what an event may send
# Gradio stores every input value of an event in the caller's session (for deep links) before any handler runs,
# and a session lives until `state_session_capacity` newer ones push it out: a handler's check comes too late to
# keep a value out of memory. So each value is sized where the request arrives (`dashboard.access.http_guard`), against
# the largest value its component needs, in bytes of the Python objects Gradio would keep (`python_size`).
# The app's largest inputs: Play's argument (a Textbox: MAX_ARGUMENT_CHARS), the Train form's Advanced JSON (a
# Code box), and the Runs table, which the page sends with a row selection.
MAX_CODE_CHARS = 20_000
#: A Dataframe input (the Runs table: ~850 bytes a row of 9 cells, so about 600 runs).
MAX_TABLE_BYTES = 512 * 1024
#: Every other input (names, lists of at most MAX_OVERLAY_RUNS names, numbers, check boxes, the owner token).
MAX_SMALL_INPUT_BYTES = 16 * 1024
#: An event's `event_data` (a row selection carries the selected row and column of the table).
MAX_EVENT_DATA_BYTES = 256 * 1024
#: A session hash (the page draws ~11 characters, gradio_client 36): a key of every per-session table.
MAX_SESSION_HASH_CHARS = 128


def text_bytes(chars: int) -> int:
    """The most a `chars`-character string takes as a Python object (4 bytes a character beyond the BMP)."""
    return 4 * chars + 100


def input_limit(component: Any) -> int:
    """The largest value (bytes of Python objects, see `python_size`) an event may send for `component`."""
    import gradio as gr  # here, not at the top: a client that only sizes values (bench/security) skips its import

    if isinstance(component, gr.Code):
        return text_bytes(MAX_CODE_CHARS)
    if isinstance(component, gr.Textbox):
        return text_bytes(getattr(component, "max_length", None) or MAX_ARGUMENT_CHARS)
    if isinstance(component, gr.Dataframe):
        return MAX_TABLE_BYTES
    return MAX_SMALL_INPUT_BYTES


def python_size(value: Any, limit: int) -> int:
    """Bytes of the Python objects of a JSON value (strings, numbers, lists, dicts; every object counted where
    it appears), counted until they pass `limit`: the walk stops there, so its cost is bounded by the limit,
    not by the value."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def oversized_input(labels: list[str], limits: list[int], values: list[Any]) -> str | None:
    """Why an event's input values are refused (the first one over its limit), or None. `labels` and `limits`
    are the event's inputs'; a value past the last input is held to `MAX_SMALL_INPUT_BYTES`."""
    for i, value in enumerate(values):
        limit = limits[i] if i < len(limits) else MAX_SMALL_INPUT_BYTES
        if python_size(value, limit) > limit:
            label = labels[i] if i < len(labels) else f"input {i + 1}"
            return f"{label} is too large: more than {limit:,} bytes."
    return None
