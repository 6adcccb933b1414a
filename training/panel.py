"""The validation panel: which train-split questions a run holds out of its warm start and of GRPO, to play them
greedily as it trains (`training.validation`). Chosen once per run, from the seed, by `RunPlan.resolve`."""

from __future__ import annotations

import random
from typing import Sequence

__all__ = ["choose_panel", "auto_panel_size", "AUTO_MAX_QUESTIONS", "AUTO_MIN_SPLIT"]

#: Auto panel: at most this many questions ...
AUTO_MAX_QUESTIONS = 64
#: ... and none for a train split smaller than this (it cannot spare an eighth of its questions).
AUTO_MIN_SPLIT = 128


def auto_panel_size(n_questions: int) -> int:
    """The auto panel's size (`validation_questions: null`) for a train split of `n_questions`: up to 64, an eighth of
    the split at most, none under 128 questions. 64 greedy episodes give a success rate to within ~±6 points (one
    standard deviation at 50%), and a paired count of the questions gained and lost that is sharper than that."""
    return min(AUTO_MAX_QUESTIONS, n_questions // 8) if n_questions >= AUTO_MIN_SPLIT else 0


def choose_panel(question_ids: Sequence[str], n: int | None, seed: int) -> tuple[str, ...]:
    """The validation panel: `n` of `question_ids` (None = `auto_panel_size`), drawn with `seed`, in the split's
    order. The same arguments always give the same panel (a resumed run, the sweep's tries).

    Raises:
        ConfigError: `n` would leave the train split with fewer than half its questions.
    """
    from training.config.errors import ConfigError

    ids = list(dict.fromkeys(str(q) for q in question_ids))
    if n is None:
        n = auto_panel_size(len(ids))
    if n <= 0:
        return ()
    if n > len(ids) // 2:
        raise ConfigError(f"validation_questions={n} would hold out more than half of the train split's {len(ids)} "
                          f"questions: use at most {len(ids) // 2}, or 0 for no validation panel")
    chosen = set(random.Random(f"validation-{seed}").sample(ids, n))
    return tuple(q for q in ids if q in chosen)
