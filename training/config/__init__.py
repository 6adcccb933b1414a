"""A SQLEnv GRPO run's configuration: `TrainConfig`, every knob in one dataclass (JSON in, JSON out, `--set`
overrides).

    config = TrainConfig.from_json("configs/tiny_cpu.json")
    config = config.with_overrides(["max_steps=5", "learning_rate=1e-4"])   # what `--set key=value` does
    config.to_json("runs/x/config.json")

Fields left at `None` are "auto": they are resolved from other fields (e.g. `max_tool_calling_iterations` from
`step_budget`, `sft` from the model) by the `resolved_*` helpers, so a saved config records what was asked for
and a run's `config.json` records what was used (`TrainConfig.resolved()`).

A config is plain data: constructing one reads no file and imports neither torch nor TRL; it checks only the values
themselves and raises `ConfigError` (a `ValueError`) naming the field and what to change. What needs the world — the
dataset on disk, TRL's own checks of `grpo`/`sft.args`, installed trackers, the device and the precision — is
resolved once, by `training.plan.RunPlan.resolve` (`training.plan.check_config` checks it without a run).

The warm start's settings are one nested section, `sft` (`WarmStart`): `{"sft": {"max_steps": 5000}}`,
`--set sft.max_steps=5000`, `--set sft=false`. Configs saved before it (flat `sft_max_steps`, `sft_args`, `sft: true`)
still load, with a deprecation message.

The package, one concept a module:
    train_config   `TrainConfig`: the fields, their defaults and docs, the resolved values, JSON in and out
    warm_start     `WarmStart`: the `sft` section
    validation     the checks a config runs on its values when built
    overrides      `--set KEY=VALUE`: keys into sections, values parsed by their field's type
    legacy         flat `sft_*` keys of older configs and commands, moved into the section
    passthrough    the TRL pass-through sections (`grpo`, `sft.args`): the fields they refuse
    field_types    a field's declared type: optional or not, its base type, the type check
    choices        the fixed sets of values some fields accept; LoRA's defaults
    errors         `ConfigError` and the "did you mean" message
It imports nothing above `training` and nothing from the ML stack (`sqlenv` lazily, for the prompts and the
teacher's mistakes).
"""

from training.config.choices import (BUILTIN_MODEL, DEVICES, LORA_DEFAULTS, PRECISIONS, QUESTION_SAMPLERS,
                                     ROLLOUT_MODES, TRACKERS)
from training.config.errors import ConfigError, unknown_key_message
from training.config.overrides import parse_value
from training.config.passthrough import GRPO_OWNED, SFT_OWNED
from training.config.train_config import TrainConfig
from training.config.warm_start import DEFAULT_TEACHER_MISTAKES, TINY_TEACHER_ERROR_RATE, WarmStart

__all__ = ["TrainConfig", "WarmStart", "ConfigError", "DEFAULT_TEACHER_MISTAKES", "BUILTIN_MODEL", "ROLLOUT_MODES",
           "QUESTION_SAMPLERS", "PRECISIONS", "DEVICES", "LORA_DEFAULTS", "TRACKERS", "GRPO_OWNED", "SFT_OWNED",
           "TINY_TEACHER_ERROR_RATE", "unknown_key_message", "parse_value"]
