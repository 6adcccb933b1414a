"""A prepared dataset directory: its layout, `DatasetInfo`, loading its questions, swapping a new build into place.

A prepared dataset is a directory::

    <dir>/dataset.json                       {"name", "source", "splits", "counts", "dropped", ...}
    <dir>/questions_<split>.json             JSON list of Question dicts
    <dir>/databases/<db_id>/<db_id>.sqlite

The builders (`sqlenv.data.builtin`, `sqlenv.data.spider`) write one; `sqlenv.data.datasets` finds one by name. This
module sits below all three and imports none of them, so they share it without an import cycle. `load_questions` is the
one question loader of the project.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlenv.types import Question

__all__ = ["DatasetInfo", "DatasetNotFoundError", "load_questions", "swap_into_place"]


class DatasetNotFoundError(ValueError):
    """A dataset name or path that does not resolve to a prepared dataset."""


@dataclass
class DatasetInfo:
    """A prepared dataset directory.

    Args:
        name: the dataset's name (`builtin`, `spider10`, or the directory name).
        root: the dataset directory.
        splits: split names, each with a `questions_<split>.json`.
        source: where it came from ("builtin", "spider", ...).
        counts: questions per split.
        meta: the whole `dataset.json` (drop counts, difficulty counts, seed, ...).
    """

    name: str
    root: Path
    splits: list[str]
    source: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def db_dir(self) -> Path:
        """The folder holding `<db_id>/<db_id>.sqlite`."""
        return self.root / "databases"

    def questions_path(self, split: str) -> Path:
        """Path of `questions_<split>.json`; an unknown split raises ValueError listing the splits."""
        if split not in self.splits:
            raise ValueError(f"dataset {self.name!r} has no split {split!r}; splits: {', '.join(self.splits)}")
        return self.root / f"questions_{split}.json"

    def load(self, split: str) -> list[Question]:
        """The questions of one split."""
        return load_questions(self.questions_path(split))

    @classmethod
    def from_dir(cls, root: Path | str) -> "DatasetInfo":
        """Read a prepared directory (its `dataset.json`, or failing that its `questions_*.json` files)."""
        root = Path(root)
        meta: dict[str, Any] = {}
        meta_path = root / "dataset.json"
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise DatasetNotFoundError(f"unreadable dataset.json in {root}: {err}") from None
        splits = list(meta.get("splits") or sorted(p.stem[len("questions_"):] for p in root.glob("questions_*.json")))
        if not splits:
            raise DatasetNotFoundError(f"{root} is not a prepared dataset (no dataset.json or questions_*.json)")
        return cls(
            name=str(meta.get("name") or root.name),
            root=root,
            splits=splits,
            source=str(meta.get("source", "")),
            counts=dict(meta.get("counts", {})),
            meta=meta,
        )


def load_questions(path: Path | str) -> list[Question]:
    """The questions of a `questions_<split>.json` file (a JSON list of `Question` dicts).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a JSON list of question records (naming the file and the first bad record).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"questions file not found: {path}")
    with open(path, encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    questions = []
    for i, record in enumerate(data):
        try:
            questions.append(Question.from_dict(record))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}: question {i} is not a question record ({type(err).__name__}: {err})") from None
    return questions


def swap_into_place(new: Path, target: Path) -> None:
    """Rename `new` to `target`, moving an old `target` aside first (rename is atomic on one filesystem)."""
    if target.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        os.replace(target, trash / target.name)
        os.replace(new, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(new, target)
