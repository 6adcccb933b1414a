"""`--set KEY=VALUE` overrides: a config's values changed by text from a command line (or a dict from code), each
value parsed by its field's declared type.

    config.with_overrides(["max_steps=20", "grpo.loss_type=dr_grpo", "sft.args.max_length=1024", "sft=false"])

Keys: a field (`max_steps=20`), a key of a dict field (`grpo.loss_type=dr_grpo`: JSON when it parses, else text), a
warm-start setting (`sft.max_steps=5000`, `sft.args.max_length=1024`; `sft=false` is `sft.enabled=false`; a dict
value of `sft` sets those settings of the section). Values: ints (`1e3` too), floats, bools
(true/false/yes/no/on/off/1/0), `null`/`none`/`auto`/empty for an optional field, lists as JSON or comma-separated,
objects as JSON.

Why not transformers' `HfArgumentParser` (TRL's `TrlParser`): it makes one `--field value` flag per dataclass field,
which cannot reach into a section (`sft.max_steps`) or a pass-through dict (`grpo.loss_type`), gives argparse no
type for a nested dataclass or a `dict` field, and has no "auto" (`null`) for an optional number; its `parse_dict`
is `cls(**data)` after an unknown-key check (what `TrainConfig.from_dict` does, with a "did you mean" hint). It
would also import transformers into a config that the dashboard and the CLI read before any ML library loads.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from training.config.errors import ConfigError, unknown_key_message
from training.config.field_types import base_type, is_optional
from training.config.legacy import upgrade_override_key
from training.config.warm_start import WarmStart

__all__ = ["apply_overrides", "parse_value", "split_override"]


def apply_overrides(config: Any, overrides: list[str] | dict[str, Any]) -> dict[str, Any]:
    """`config`'s values (`dataclasses.asdict`) with `overrides` applied: `key=value` strings, parsed by the field's
    type, or a dict of values, used as they are. The caller builds the new config from them, which checks them."""
    data = dataclasses.asdict(config)
    names = {f.name: f for f in dataclasses.fields(config)}
    sft_fields = {f.name: f for f in dataclasses.fields(WarmStart)}
    items = overrides.items() if isinstance(overrides, dict) else (split_override(o) for o in overrides)
    for key, value in items:
        key = upgrade_override_key(key)  # `sft_max_steps=...` of older commands: the section's key
        head, _, sub = key.partition(".")
        if head == "sft":
            name, _, arg = sub.partition(".")
            if not sub and isinstance(value, dict):  # {"sft": {...}}: these settings of the section
                data["sft"] = dataclasses.asdict(WarmStart.from_value({**data["sft"], **value}))
                continue
            if not sub:  # sft=false: the switch alone
                name = "enabled"
            if name not in sft_fields:
                raise ConfigError(unknown_key_message(name, sft_fields, prefix="sft."))
            if arg and name == "args":
                data["sft"]["args"] = {**data["sft"]["args"],
                                       arg: _parse_json_or_text(value) if isinstance(value, str) else value}
            elif arg:
                raise ConfigError(f"sft.{name} has no keys: set sft.{name}=VALUE")
            else:
                data["sft"][name] = (parse_value(sft_fields[name], value, prefix="sft.") if isinstance(value, str)
                                     else value)
            continue
        if sub and head in names and base_type(names[head].type) is dict:
            # `grpo.loss_type=dr_grpo`: one key of a dict field; the value is JSON when it parses, else text.
            data[head] = {**(data[head] or {}), sub: _parse_json_or_text(value) if isinstance(value, str) else value}
            continue
        if key not in names:
            raise ConfigError(unknown_key_message(key, names))
        data[key] = parse_value(names[key], value) if isinstance(value, str) else value
    return data


def split_override(text: str) -> tuple[str, str]:
    """`"key=value"` → `("key", "value")`, both stripped; the value may hold `=` itself."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _parse_json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip()


def parse_value(f: dataclasses.Field, text: str, prefix: str = "") -> Any:
    """Parse a `--set` value by the field's type: ints, floats, bools (true/false/yes/no/1/0), null, lists.
    `prefix` names the field's section in the error (`"sft."`)."""
    lowered = text.strip().lower()
    if is_optional(f.type) and lowered in ("none", "null", "auto", ""):
        return None
    base = base_type(f.type)
    try:
        if base is bool:
            if lowered in ("true", "yes", "on", "1"):
                return True
            if lowered in ("false", "no", "off", "0"):
                return False
            raise ValueError
        if base is int:
            number = float(text)
            if number != int(number):
                raise ValueError
            return int(number)
        if base is float:
            return float(text)
        if base is list:
            if text.strip().startswith("["):
                value = json.loads(text)
            elif f.name in ("report_to", "teacher_mistakes"):
                value = [x.strip() for x in text.split(",") if x.strip() and x.strip() != "none"]
            else:
                value = [float(x) for x in text.split(",")]
            if not isinstance(value, list):
                raise ValueError
            return value
        if base is dict:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except ValueError:  # json.JSONDecodeError is a ValueError
        raise ConfigError(f"{prefix}{f.name}={text!r}: expected {'a JSON object' if base is dict else base.__name__}") from None
    return text
