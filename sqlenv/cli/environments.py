"""The dataset and split a command names, checked once and turned into environments (`play`, `eval`, `serve`).

Wherever a dataset is named, `builtin`, a name prepared under `data/` ($SQLENV_DATA_DIR) or the path of a prepared
dataset directory works; an unknown one, or a split it lacks, is a `CLIError`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable

from sqlenv.cli.arguments import CLIError, one_line


def resolve(name_or_path: str) -> Any:
    """The `DatasetInfo` of a dataset name or path; an unknown one is a `CLIError`."""
    from sqlenv.data.datasets import resolve_dataset

    try:
        return resolve_dataset(name_or_path)
    except ValueError as exc:  # DatasetNotFoundError is a ValueError
        raise CLIError(one_line(exc)) from None


def env_factory(dataset: str, split: str | None, budget: int) -> tuple[Callable[[], Any], Any, str]:
    """(a function returning a new environment on the split, dataset info, split), bad input checked once.

    Args:
        dataset: a dataset name or path.
        split: the split; None picks `eval` when the dataset has it, else its first split.
        budget: the environments' step budget.
    """
    from sqlenv.environment import SQLEnvironment

    info = resolve(dataset)
    splits = list(getattr(info, "splits", []) or [])
    if split is None:
        split = "eval" if "eval" in splits else (splits[0] if splits else "eval")
    try:
        questions_path = info.questions_path(split)
    except ValueError as exc:
        raise CLIError(one_line(exc)) from None
    if not Path(questions_path).exists():
        raise CLIError(f"dataset {info.name!r} has no split {split!r} (missing {questions_path})")
    return partial(SQLEnvironment, questions_path=questions_path, db_dir=info.db_dir, step_budget=budget), info, split
