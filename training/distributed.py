"""Which process this is in a distributed run (`accelerate launch`, torchrun), read from the environment or the
trainer's state: one definition each, for the run, the phases and the trainer hooks. No torch import."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["world_size", "is_main_process", "is_main", "unwrap"]


def world_size() -> int:
    """Processes in the run (`WORLD_SIZE`; 1 when not launched distributed)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_main_process() -> bool:
    """Whether this process is rank 0 (`RANK`, else `LOCAL_RANK`; True when not launched distributed): the one that
    writes the run's files and prints."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def is_main(state: Any) -> bool:
    """Whether a trainer hook runs in the main process, from TRL's `TrainerState` (True without the attribute)."""
    return bool(getattr(state, "is_world_process_zero", True))


def unwrap(model: Any) -> Any:
    """The bare model under DDP/accelerate wrappers (generation needs `generate`)."""
    while hasattr(model, "module") and not hasattr(model, "generate"):
        model = model.module
    return model
