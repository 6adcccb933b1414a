"""What one run of `bench/gpu/gpu_check.py` plays: `Profile` (each item's sizes, the fields it sets on the recipes),
for a real run (`real_profile`: the command line's sizes) or the dry run (`dry_profile`: the built-in tiny model on
a toy dataset of ten questions, prepared on the fly, on the CPU, at sizes of seconds)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

__all__ = ["Profile", "real_profile", "dry_profile", "toy_dataset", "REAL_ITEM_MIN_S"]

#: Seconds left before the deadline that items 3 (exactness), 4 (a zero-shot GRPO step, its log-prob gap and the
#: memory probe) and 6 (the bf16 step) need to start; call 2 plays them after the learning runs, if time is left.
REAL_ITEM_MIN_S = {3: 40.0, 4: 90.0, 6: 60.0}
#: The dry run's (seconds of the tiny model on a CPU).
DRY_ITEM_MIN_S = {3: 5.0, 4: 5.0, 6: 5.0}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one check plays: the sizes of each item, and the config fields it changes in the recipes.

    Args:
        overrides: `TrainConfig` fields set on every recipe of the check (model, data, and in the dry run the sizes).
        rows: decoder rows of item 2.
        cb_rows: the rows of item 2 at which transformers' continuous batching is measured too.
        decode_tokens: tokens per turn each row generates in item 2.
        decoder_budget_s: seconds item 2 may spend (what does not fit is listed as skipped).
        exact_episodes: episodes of item 3.
        probe_rows: micro-batch sizes of item 4's memory probe.
        deadline_s: seconds from the start by which item 7 must be done, and after which no item starts (items 3, 4
            and 6 start only with `item_min_s` seconds left before it).
        item_min_s: per item number, the seconds it needs left before the deadline to start.
    """

    overrides: dict
    rows: tuple[int, ...]
    cb_rows: tuple[int, ...]
    decode_tokens: int
    decoder_budget_s: float
    exact_episodes: int
    probe_rows: tuple[int, ...]
    deadline_s: float
    item_min_s: dict = dataclasses.field(default_factory=dict)


def real_profile(args: argparse.Namespace) -> Profile:
    overrides: dict[str, Any] = {"model": args.model}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    return Profile(overrides, rows=args.rows or (16, 64, 256), cb_rows=args.cb_rows or (64,),
                   decode_tokens=args.decode_tokens, decoder_budget_s=args.decoder_seconds,
                   exact_episodes=args.exact_episodes, probe_rows=args.probe_rows or (8, 16),
                   deadline_s=(args.deadline_minutes or 8.0) * 60, item_min_s=dict(REAL_ITEM_MIN_S))


def dry_profile(args: argparse.Namespace, scratch: Path) -> Profile:
    """The built-in tiny model on a toy dataset (train and eval: the same ten questions), on the CPU, at sizes of
    seconds, in fp32 (the run config refuses bf16 on a CPU)."""
    toy = toy_dataset(scratch / "toy")
    overrides = {"model": "builtin:tiny", "dataset": str(toy), "device": "cpu", "precision": "fp32",
                 "cpu_threads": 1, "num_generations": 2, "per_device_train_batch_size": 2,
                 "gradient_accumulation_steps": 2, "step_budget": 3, "max_turn_tokens": 16,
                 "max_completion_length": 96, "max_steps": 2, "comparison_episodes": 10, "prompt": "full",
                 "keep_best": False,  # ten questions leave no room for a validation panel to keep by
                 "sft": {"enabled": True, "max_steps": 3, "batch_size": 2, "eval_every": 0}}
    rows = args.rows or (2, 4)
    return Profile(overrides, rows=rows, cb_rows=args.cb_rows or (min(rows),), decode_tokens=4,
                   decoder_budget_s=args.decoder_seconds, exact_episodes=2, probe_rows=args.probe_rows or (2, 4),
                   deadline_s=(args.deadline_minutes or 5.0) * 60, item_min_s=dict(DRY_ITEM_MIN_S))


def toy_dataset(folder: Path) -> Path:
    """`sqlenv.checker.build_toy_dataset`'s ten questions, as both the train and the eval split."""
    from sqlenv.checker import build_toy_dataset

    questions, _ = build_toy_dataset(folder)
    items = json.loads(questions.read_text())
    (folder / "questions_eval.json").write_text(json.dumps([{**q, "split": "eval"} for q in items], indent=1))
    (folder / "dataset.json").write_text(json.dumps({"name": "toy", "source": "toy", "splits": ["train", "eval"],
                                                     "counts": {"train": len(items), "eval": len(items)},
                                                     "dropped": 0}, indent=1))
    return folder
