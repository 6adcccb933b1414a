"""The TRL pass-through sections, `grpo` (any `trl.GRPOConfig` field) and `sft.args` (any `trl.SFTConfig` field):
the fields this config sets itself, refused there with the field to set instead, and no credential in either.

TRL checks the rest of their keys when the run is planned (`training.plan.check_config`).
"""

from __future__ import annotations

from training.config.errors import ConfigError

__all__ = ["GRPO_OWNED", "SFT_OWNED", "check_owned_keys"]

_RUN_FILES = "the run directory decides it (output_dir / run_id)"
#: GRPOConfig fields this config sets itself (`grpo.<field>` is refused), with what to set instead.
GRPO_OWNED = {
    **{name: f"set `{name}` (a TrainConfig field)" for name in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "learning_rate", "max_steps",
        "num_train_epochs", "beta", "temperature", "reward_weights", "seed", "gradient_checkpointing",
        "save_steps", "save_total_limit", "report_to")},
    "max_completion_length": "the episode's token budget: set `max_completion_length` (auto from the model)",
    "max_tool_calling_iterations": "derived from `step_budget` so TRL stops when the budget is spent; set "
                                   "`max_tool_calling_iterations` or `step_budget`",
    "chat_template_kwargs": "set `enable_thinking`",
    "bf16": "precision is ours: set `precision` (bf16, fp16, fp32 or auto)",
    "fp16": "precision is ours: set `precision` (bf16, fp16, fp32 or auto)",
    "use_cpu": "the device is ours: set `device`",
    "output_dir": _RUN_FILES, "run_name": "the run id is the tracker's run name (run_id)",
    "logging_dir": _RUN_FILES,
    "logging_steps": "set `plot_every` (one metrics line per N steps)",
    "save_strategy": "set `save_steps` (0 = no checkpoints)",
    "resume_from_checkpoint": "resume with `python -m training.train --resume runs/<id>`",
    "remove_unused_columns": "must stay false: the environment reads each row's question_id",
}
#: SFTConfig fields the warm start sets itself (`sft.args.<field>` is refused).
SFT_OWNED = {
    "num_train_epochs": "set `sft.epochs`", "max_steps": "set `sft.max_steps`",
    "learning_rate": "set `sft.learning_rate`", "per_device_train_batch_size": "set `sft.batch_size`",
    "seed": "set `seed`", "gradient_checkpointing": "set `gradient_checkpointing`",
    "assistant_only_loss": "the warm start's examples carry their own mask: the loss is on the model's turns only",
    "bf16": "set `sft.precision` (the warm start's own) or `precision` (the run's)",
    "fp16": "set `sft.precision` (the warm start's own) or `precision` (the run's)", "use_cpu": GRPO_OWNED["use_cpu"],
    "output_dir": _RUN_FILES, "run_name": GRPO_OWNED["run_name"], "logging_dir": _RUN_FILES,
    "save_strategy": GRPO_OWNED["save_strategy"], "save_steps": "set `save_steps`",
    "save_total_limit": "set `save_total_limit`", "report_to": "set `report_to`",
    "resume_from_checkpoint": GRPO_OWNED["resume_from_checkpoint"],
}



def check_owned_keys(name: str, values: dict, owned: dict[str, str]) -> None:
    """`grpo` / `sft.args`: none of the fields this config sets itself (TRL checks the rest: `check_config`), and no
    key named like a credential at any depth."""
    for key in values:
        if key in owned:
            raise ConfigError(f"{name}.{key} is set by this config and cannot be overridden: {owned[key]}")
    from training.run.secrets import secret_paths

    # The config is saved in the run's config.json, which the dashboard shows to anyone: no credentials in it.
    found = secret_paths(values, name)
    if found:
        raise ConfigError(f"{found[0]} looks like a secret (a token, key or password) and would be saved in the "
                          "run's config.json, which anyone may read: remove it; a run takes its Hub token from the "
                          "environment (HF_TOKEN)")

