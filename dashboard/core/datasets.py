"""The datasets a page offers: `builtin` and those prepared under the data folder, and a dataset's splits."""

from __future__ import annotations

from pathlib import Path

from sqlenv.data.datasets import list_datasets, resolve_dataset

__all__ = ["dataset_choices", "dataset_splits"]


def dataset_choices(data_root: Path | None = None) -> list[str]:
    """`builtin` first, then every dataset prepared under the data folder."""
    names = ["builtin"]
    try:
        for info in list_datasets(data_root):
            if info.name not in names:
                names.append(info.name)
    except Exception:  # a broken data folder must not stop the app from serving
        pass
    return names


def dataset_splits(name: str, data_root: Path | None = None) -> tuple[list[str], str | None]:
    """(splits, None) or ([], error message)."""
    try:
        info = resolve_dataset(name, data_root)
        return list(info.splits), None
    except Exception as exc:
        return [], str(exc)
