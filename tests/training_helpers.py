"""Helpers of the real-training tests (a module of its own: `conftest` names two modules in this tree)."""

from __future__ import annotations

import functools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@functools.cache
def built_tiny_model() -> Path:
    """The built-in tiny model (seed 0, built-in dataset) in the repository's model cache, `runs/models/`, built
    once for every test process: under pytest-xdist both workers would otherwise build it side by side on a fresh
    clone (~15 s of CPU each; the build's atomic rename keeps one whole copy). A file lock makes the second wait and
    reuse the first's."""
    from filelock import FileLock

    from training.models import tiny_model_dir

    cache = REPO / "runs" / "models"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / ".tests-build.lock")):
        return tiny_model_dir(cache_dir=cache)


def small_train_config(tmp_path, **overrides):
    """A TrainConfig for a 2-step GRPO run of the tiny model on CPU: 2-step episodes, 16-token turns, no SFT,
    metrics every step, no validation panel and no KL probe (tests of them ask for one); `overrides` set any field.
    Keeps a real training test to seconds."""
    from training.config import TrainConfig

    values = dict(
        max_steps=2, num_generations=2, per_device_train_batch_size=2, step_budget=2, max_completion_length=96,
        max_turn_tokens=16, sft=False, compare_base=False, plot_every=1, trace_every=0, eval_every=0,
        eval_episodes=1, comparison_episodes=2, device="cpu", precision="fp32", seed=0, validation_questions=0,
        kl_probe_episodes=0, output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    if (values.get("model", "builtin:tiny"), values.get("dataset", "builtin"), values["seed"]) == (
            "builtin:tiny", "builtin", 0):
        built_tiny_model()  # the one the run loads (its seed, its dataset), from the same cache
    return TrainConfig(**values)
