"""How a config says what is wrong: `ConfigError`, naming the field and what to change, with a "did you mean" hint
for a mistyped key."""

from __future__ import annotations

import difflib
from typing import Any, NoReturn

__all__ = ["ConfigError", "fail", "unknown_key_message"]


class ConfigError(ValueError):
    """An invalid TrainConfig value or combination; the message says which field and what to change."""


def fail(message: str) -> NoReturn:
    raise ConfigError(message)


def unknown_key_message(key: str, names: Any, prefix: str = "", what: str = "config key") -> str:
    """`unknown config key 'max_step' (did you mean 'max_steps'?)`: `names` are the keys allowed, `prefix` the
    section they live in (`"sft."`), `what` what a key is called where it was read."""
    close = difflib.get_close_matches(key, list(names), n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    return f"unknown {what} '{prefix}{key}'{hint}"
