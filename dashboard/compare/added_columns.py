"""The Compare tab's added columns: a saved evaluation (`sqlenv.evaluation.saved`, under `runs/evaluations/`) or
another run's trained model, scored on the run's own eval questions beside its columns (`dashboard.core.results`).

An added column keeps only its episodes on questions the run played (matched by question id: a Spider question keeps
its id in every dataset prepared from Spider), and says how many of the run's questions it covers. Names from the
page go through `training.run.directory.resolve_run`, under the runs folder or its `evaluations/` folder only.
"""

from __future__ import annotations

from typing import Any

from dashboard.access.inputs import InputRefused, quote
from dashboard.core.results import Column, question_ids, run_columns
from sqlenv.evaluation.saved import EVALUATIONS_FOLDER, SavedEvaluationError, list_evaluations, load_evaluation
from training.run.directory import InvalidRunName, resolve_run

__all__ = ["EVAL_PREFIX", "RUN_PREFIX", "MAX_ADDED", "source_choices", "load_source", "on_questions", "columns_for"]

#: Prefixes of an added column's value: a saved evaluation, or another run's trained model.
EVAL_PREFIX, RUN_PREFIX = "eval:", "run:"
#: Most columns added at once (each one reads a file).
MAX_ADDED = 6


def source_choices(runs: Any, exclude: str | None = None) -> list[tuple[str, str]]:
    """(label, value) of every column that can be added: saved evaluations, then runs with a comparison."""
    choices = []
    for path in list_evaluations(runs.runs_root / EVALUATIONS_FOLDER):
        try:
            choices.append((f"evaluation: {load_evaluation(path, with_episodes=False).label}",
                            EVAL_PREFIX + path.name))
        except SavedEvaluationError:
            continue
    for row in runs.list():
        run_id = row["run_id"]
        if run_id != exclude and (runs.runs_root / run_id / "comparison.jsonl").exists():
            choices.append((f"run: {run_id} (trained)", RUN_PREFIX + run_id))
    return choices


def load_source(runs: Any, value: Any) -> Column:
    """The column a page asked for (`eval:<name>` or `run:<id>`); `InputRefused` with the reason otherwise."""
    if not isinstance(value, str) or not value.startswith((EVAL_PREFIX, RUN_PREFIX)):
        raise InputRefused(f"Unknown column {quote(value)}.")
    kind, name = value.split(":", 1)
    try:
        if kind + ":" == EVAL_PREFIX:
            saved = load_evaluation(resolve_run(name, runs.runs_root / EVALUATIONS_FOLDER).path)
            return Column(f"evaluation: {saved.name}", saved.episodes)
        snap = runs.snapshot(name)
    except (InvalidRunName, FileNotFoundError, SavedEvaluationError, OSError) as exc:
        raise InputRefused(f"Cannot add {quote(value)}: {exc}") from None
    trained = next((c for c in run_columns(snap) if c.label == "trained"), None)
    if trained is None:
        raise InputRefused(f"Run {quote(name)} has no comparison yet.")
    return Column(f"run: {snap.run_id}", trained.episodes)


def on_questions(column: Column, ids: list[str]) -> Column:
    """`column` restricted to the questions in `ids`, with a note saying how many of them it covers."""
    wanted = set(ids)
    kept = [ep for ep in column.episodes if str(ep.get("question_id")) in wanted]
    covered = len({str(ep.get("question_id")) for ep in kept})
    note = f"{covered} of {len(wanted)} questions" if covered < len(wanted) else ""
    return Column(column.label, kept, note)


def columns_for(runs: Any, snap: Any, added: Any) -> tuple[list[Column], list[str]]:
    """The run's columns plus the `added` ones on its questions, and the messages of those refused."""
    columns = run_columns(snap)
    ids = question_ids(columns)
    problems: list[str] = []
    values = [] if added is None else added
    if not isinstance(values, (list, tuple)):
        return columns, ["Added columns must be a list."]
    if len(values) > MAX_ADDED:
        return columns, [f"Too many added columns: {len(values)} (at most {MAX_ADDED})."]
    for value in values:
        try:
            column = on_questions(load_source(runs, value), ids)
        except InputRefused as exc:
            problems.append(str(exc))
            continue
        if not column.episodes:
            problems.append(f"{column.label} played none of this run's eval questions.")
            continue
        columns.append(column)
    return columns, problems
