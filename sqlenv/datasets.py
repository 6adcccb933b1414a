"""Prepared datasets: where they live, how a name resolves to one, and how questions load.

A prepared dataset is a directory::

    <dir>/dataset.json                       {"name", "source", "splits", "counts", "dropped", ...}
    <dir>/questions_<split>.json             JSON list of Question dicts
    <dir>/databases/<db_id>/<db_id>.sqlite

`resolve_dataset("builtin")` builds the built-in dataset into `<data_root>/builtin` on first use (a few
seconds, deterministic) and rebuilds it when its stamp (builder version, seed) is stale.
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

BUILTIN_NAME = "builtin"


class DatasetNotFoundError(ValueError):
    """A dataset name or path that does not resolve to a prepared dataset."""


def data_root() -> Path:
    """Where prepared datasets live: `$SQLENV_DATA_DIR`, or `data` (relative to the working directory)."""
    return Path(os.environ.get("SQLENV_DATA_DIR") or "data")


_default_data_root = data_root  # the parameters below shadow the name


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
    """Load a `questions_<split>.json` file as Question records."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"questions file not found: {path}")
    data = json.loads(path.read_text())
    return [Question.from_dict(d) for d in data]


def _is_prepared(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset.json").exists() or any(path.glob("questions_*.json")))


def list_datasets(data_root: Path | str | None = None) -> list[DatasetInfo]:
    """The prepared datasets under `data_root` (default `data_root()`), sorted by name."""
    root = Path(data_root) if data_root is not None else _default_data_root()
    if not root.is_dir():
        return []
    found = []
    for child in sorted(root.iterdir()):
        if child.name.startswith(".") or not _is_prepared(child):
            continue
        try:
            found.append(DatasetInfo.from_dir(child))
        except DatasetNotFoundError:
            continue
    return found


def resolve_dataset(name_or_path: str | Path | DatasetInfo, data_root: Path | str | None = None) -> DatasetInfo:
    """Resolve a dataset name or directory to a `DatasetInfo` (one already resolved is returned as it is).

    `"builtin"` is built into `<data_root>/builtin` on first use (and rebuilt when stale); any other name
    must be a prepared directory under `data_root` (default `data_root()`); a path must be a prepared
    directory. Anything else raises `DatasetNotFoundError` listing what exists.
    """
    if isinstance(name_or_path, DatasetInfo):
        return name_or_path
    root = Path(data_root) if data_root is not None else _default_data_root()
    text = str(name_or_path).strip()
    if not text:
        raise DatasetNotFoundError("empty dataset name")
    if text == BUILTIN_NAME:
        from sqlenv.builtin import ensure_builtin

        return ensure_builtin(root / BUILTIN_NAME)
    path = Path(text).expanduser()
    if _is_prepared(path):
        return DatasetInfo.from_dir(path)
    if "/" not in text and os.sep not in text and _is_prepared(root / text):
        return DatasetInfo.from_dir(root / text)
    available = [BUILTIN_NAME] + [d.name for d in list_datasets(root) if d.name != BUILTIN_NAME]
    raise DatasetNotFoundError(
        f"unknown dataset {text!r}: not a prepared directory nor a name under {root}; available: {', '.join(available)}"
    )


def swap_into_place(new: Path, target: Path) -> None:
    """Rename `new` to `target`, moving an old `target` aside first (rename is atomic on one filesystem)."""
    if target.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        os.replace(target, trash / target.name)
        os.replace(new, target)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(new, target)
