"""Helpers of the real-training tests (a module of its own: `conftest` names two modules in this tree)."""

from __future__ import annotations


def small_train_config(tmp_path, **overrides):
    """A TrainConfig for a 2-step GRPO run of the tiny model on CPU: 2-step episodes, 16-token turns, no SFT,
    metrics every step; `overrides` set any field. Keeps a real training test to seconds."""
    from training.config import TrainConfig

    values = dict(
        max_steps=2, num_generations=2, per_device_train_batch_size=2, step_budget=2, max_completion_length=96,
        max_turn_tokens=16, sft=False, compare_base=False, plot_every=1, trace_every=0, eval_every=0,
        eval_episodes=1, comparison_episodes=2, device="cpu", precision="fp32", seed=0,
        output_dir=str(tmp_path / "run"),
    )
    values.update(overrides)
    return TrainConfig(**values)
