"""Configs and commands from before the warm start's `sft` section: flat `sft_max_steps`, `sft_args`, ... keys (and
`sft: true` as the switch alone) still load, moved into the section, with one deprecation message naming them.

    {"sft": true, "sft_max_steps": 5000}     → {"sft": {"enabled": true, "max_steps": 5000}}
    --set sft_max_steps=5000                 → --set sft.max_steps=5000
"""

from __future__ import annotations

import warnings
from typing import Any

from training.config.errors import ConfigError

__all__ = ["LEGACY_SFT_KEYS", "upgrade_flat_sft_keys", "upgrade_override_key"]

#: Flat warm-start keys of configs saved before the `sft` section, by the section's key each became.
LEGACY_SFT_KEYS = {f"sft_{name}": f"sft.{name}" for name in (
    "epochs", "max_steps", "learning_rate", "batch_size", "episodes", "teacher_error_rate", "teacher_mistakes",
    "eval_every", "describe", "args")}


def upgrade_flat_sft_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Move an older config's flat `sft_*` keys (and an `sft` switch) into the `sft` section, saying so once.
    `data` is left as it is; a config with no such key is returned unchanged."""
    legacy = [k for k in data if k in LEGACY_SFT_KEYS]
    if not legacy:
        return data
    data = dict(data)
    section = data.get("sft")
    section = {"enabled": section} if section is None or isinstance(section, bool) else dict(section)
    for key in legacy:
        name = LEGACY_SFT_KEYS[key].split(".", 1)[1]
        value = data.pop(key)
        if name in section and section[name] != value:
            raise ConfigError(f"{key} and sft.{name} are both set: keep sft.{name}")
        section[name] = value
    data["sft"] = section
    _warn(legacy, stacklevel=4)  # points at whoever called TrainConfig.from_dict
    return data


def upgrade_override_key(key: str) -> str:
    """An override's key with an older command's flat head moved into the section (`sft_args.max_length` →
    `sft.args.max_length`), saying so; any other key unchanged."""
    head, _, sub = key.partition(".")
    if head not in LEGACY_SFT_KEYS:
        return key
    _warn([head], stacklevel=5)  # points at whoever called TrainConfig.with_overrides
    return f"{LEGACY_SFT_KEYS[head]}.{sub}" if sub else LEGACY_SFT_KEYS[head]


def _warn(keys: list[str], stacklevel: int) -> None:
    warnings.warn(f"config keys {', '.join(keys)} are deprecated: the warm start's settings live in the `sft` "
                  f"section now ({', '.join(LEGACY_SFT_KEYS[k] for k in keys)}); read with them moved there",
                  FutureWarning, stacklevel=stacklevel)
