"""Prepared datasets by name: where they live, which exist, and how a name resolves to one.

`resolve_dataset("builtin")` builds the built-in dataset into `<data_root>/builtin` on first use (a few
seconds, deterministic) and rebuilds it when its stamp (builder version, seed) is stale. The directory layout,
`DatasetInfo` and the question loader `load_questions` live in `sqlenv.data.dataset_dir` (below the builders, which
write directories) and are re-exported here.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlenv.data.builtin import ensure_builtin
from sqlenv.data.dataset_dir import DatasetInfo, DatasetNotFoundError, load_questions, swap_into_place

__all__ = ["BUILTIN_NAME", "DatasetInfo", "DatasetNotFoundError", "data_root", "list_datasets", "load_questions",
           "prepare_hint", "resolve_dataset", "swap_into_place"]

BUILTIN_NAME = "builtin"


def data_root() -> Path:
    """Where prepared datasets live: `$SQLENV_DATA_DIR`, or `data` (relative to the working directory)."""
    return Path(os.environ.get("SQLENV_DATA_DIR") or "data")


_default_data_root = data_root  # the parameters below shadow the name


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
        return ensure_builtin(root / BUILTIN_NAME)
    path = Path(text).expanduser()
    if _is_prepared(path):
        return DatasetInfo.from_dir(path)
    if "/" not in text and os.sep not in text and _is_prepared(root / text):
        return DatasetInfo.from_dir(root / text)
    available = [BUILTIN_NAME] + [d.name for d in list_datasets(root) if d.name != BUILTIN_NAME]
    hint = prepare_hint(text, root)
    if hint:  # a name we know how to make: say how, rather than only that it is missing
        raise DatasetNotFoundError(f"dataset {text!r} is not prepared under {root}; {hint}; "
                                   f"available now: {', '.join(available)}")
    raise DatasetNotFoundError(
        f"unknown dataset {text!r}: not a prepared directory nor a name under {root}; available: {', '.join(available)}"
    )


def prepare_hint(name: str, data_root: Path | str | None = None) -> str | None:
    """For a dataset name that `python -m sqlenv data prepare` knows (a Spider preset: spider10, spider_dev), the
    exact command that prepares it under `data_root` (plus the download, when the Spider copy it reads is
    missing); None for any other name."""
    from sqlenv.data.spider import PRESETS, default_spider_dir  # only on this error path: it imports sqlglot

    if name not in PRESETS:
        return None
    root = Path(data_root) if data_root is not None else _default_data_root()
    command = f"python -m sqlenv data prepare spider --preset {name}"
    if root.resolve() != _default_data_root().resolve():  # the command's default --out is <data root>/<preset>
        command += f" --out {root / name}"
    source = default_spider_dir()
    if not (source / "tables.json").is_file():
        return (f"prepare it with `{command} --source DIR` after fetching Spider with "
                f"`python -m sqlenv data download spider --out DIR`")
    return f"prepare it with `{command}`"
