"""The Runs tab's table: one row per run under runs/ (dashboard, CLI, accelerate; finished, live or broken), with
its headline result (`training.run.results.Measured`: the final comparison's trained model, else the last
periodic eval) read through the run cache.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd

from dashboard.core.formatting import percent
from dashboard.core.run_data import RunCache

__all__ = ["TABLE_HEADERS", "TABLE_WIDTHS", "runs_table"]

# "success" and "EX" are one measurement, and "measured on" says which (`training.run.results.Measured`): the final comparison's
# trained model, else the last periodic eval; the run detail says it in the same words.
TABLE_HEADERS = ["run", "status", "model", "dataset", "steps", "success", "EX", "measured on", "started"]
TABLE_WIDTHS = ["auto"] * 7 + ["260px", "auto"]  # "measured on" wraps in a fixed width; the rest fit their cells


def runs_table(rows: list[dict[str, Any]], runs: RunCache | Path | None = None) -> pd.DataFrame:
    """The Runs table: one row per listed run (`RunCache.list`), its headline result read through `runs` (a cache,
    or the runs folder)."""
    if runs is not None and not isinstance(runs, RunCache):
        runs = RunCache(Path(runs))
    data = []
    for r in rows:
        step, total = r.get("step"), r.get("total_steps")
        steps = f"{step if step is not None else '?'} / {total if total is not None else '?'}"
        measured = None
        if runs is not None:
            try:
                measured, _ = runs.measures(r["run_id"])
            except (ValueError, OSError):  # gone or renamed since it was listed
                measured = None
        started = r.get("started_at")
        if isinstance(started, str):
            started = started.replace("T", " ")[:19]
        elif started is None:
            started = dt.datetime.fromtimestamp(r.get("mtime", 0)).strftime("%Y-%m-%d %H:%M:%S") + " (mtime)"
        data.append([
            r.get("run_id", "?"), r.get("status", "unknown"), str(r.get("model", "?")), str(r.get("dataset", "?")),
            steps, percent(measured.success if measured else None), percent(measured.execution if measured else None),
            measured.label if measured else "not measured yet", started,
        ])
    return pd.DataFrame(data, columns=TABLE_HEADERS)
