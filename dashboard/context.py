"""What every tab shares: the training runner, the run cache, where data lives. Built once per app."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dashboard.run_data import RunCache
from dashboard.runner import TrainingRunner

# The Train tab's gr.Timer interval (seconds). Each tick is a long poll (train_tab.poll) that answers when the
# run has news or after LONG_POLL_SECONDS; ticks while one is waiting are skipped in the browser at no cost.
# So this bounds the gap between one answer and the next poll (part of the "logged -> plotted" latency), and
# LONG_POLL_SECONDS is how often an idle page updates its status bar's clock.
POLL_SECONDS = 0.5
LONG_POLL_SECONDS = 5.0


@dataclass
class AppContext:
    runner: TrainingRunner
    runs: RunCache
    data_root: Path | None = None
    default_config: Path | None = None  # the Train form's starting values (default configs/tiny_cpu.json)
    poll_seconds: float = POLL_SECONDS
    long_poll_seconds: float = LONG_POLL_SECONDS

    @classmethod
    def create(cls, runs_root: Path | None = None, data_root: Path | None = None,
               default_config: Path | None = None) -> "AppContext":
        runner = TrainingRunner.instance(runs_root)
        return cls(runner=runner, runs=RunCache(runner.runs_root), data_root=data_root,
                   default_config=default_config)


def dataset_choices(data_root: Path | None = None) -> list[str]:
    """`builtin` first, then every dataset prepared under the data folder."""
    names = ["builtin"]
    try:
        from sqlenv.datasets import list_datasets

        for info in list_datasets(data_root):
            if info.name not in names:
                names.append(info.name)
    except Exception:  # a broken data folder must not stop the app from serving
        pass
    return names


def dataset_splits(name: str, data_root: Path | None = None) -> tuple[list[str], str | None]:
    """(splits, None) or ([], error message)."""
    try:
        from sqlenv.datasets import resolve_dataset

        info = resolve_dataset(name, data_root)
        return list(info.splits), None
    except Exception as exc:
        return [], str(exc)
