"""Secrets in a run's records: a run's config.json is shown to anyone on the dashboard's Runs tab and pushed
with the run to the Hub, so no credential belongs in it. The config refuses one (`secret_paths`); readers show
`REDACTED` in place of one that reached a run's files anyway (`redact_secrets`)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REDACTED", "is_secret_name", "is_secret_value", "secret_paths", "redact_secrets"]

#: What readers show in place of a secret (see `is_secret_name`, `is_secret_value`).
REDACTED = "<redacted>"
# A run's config.json is shown to anyone on the dashboard's Runs tab and pushed with the run to the Hub, so no
# credential belongs in it (the Hub token comes from the environment, HF_TOKEN): no value under a key named like
# one, and no value that looks like one whatever its key.
_SECRET_WORDS = ("token", "password", "passwd", "passphrase", "secret", "apikey", "credential", "credentials",
                 "auth", "authorization")
# `<x>_token` names that hold a tokenizer's special token (SFTConfig.eos_token, pad_token), not a credential.
_SPECIAL_TOKENS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# Credentials by their form: a Hub token (hf_ and 34 letters), an HTTP Authorization value (Bearer or Basic and 16
# or more characters of credentials), and the prefixed keys of common APIs (sk-..., ghp_..., github_pat_...).
# Linear time: each quantified run follows a literal it cannot match, and succeeds once it is long enough.
_SECRET_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}|\b(?i:bearer|basic)\s++[A-Za-z0-9._~+/=-]{16,}"
                           r"|\b(?:sk|gh[pousr]|github_pat)[-_][A-Za-z0-9_]{20,}")


def is_secret_name(name: Any) -> bool:
    """Whether a config key names a credential: a word `token` (hub_token, use_auth_token, hfToken), `key`
    (api_key, private_key), `password`, `secret`, `auth` (hf_auth, Authorization), ... Counts (`max_tokens`) and
    special tokens (`eos_token`) are not secrets."""
    if not isinstance(name, str):
        return False
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]
    if len(words) == 2 and words[0] in _SPECIAL_TOKENS and words[1] == "token":
        return False
    return any(w == "key" or w.endswith(_SECRET_WORDS) for w in words)


def is_secret_value(value: Any) -> bool:
    """Whether a value holds a credential by its form, whatever its key: `hf_...` Hub tokens, `Bearer ...` or
    `Basic ...` authorization values, `sk-...` / `ghp_...` / `github_pat_...` API keys (also inside longer text)."""
    return isinstance(value, str) and _SECRET_VALUE.search(value) is not None


def secret_paths(obj: Any, prefix: str = "") -> list[str]:
    """The dotted paths of every secret in `obj` (dicts and lists, any depth): keys named like a credential and
    values that look like one, e.g. `grpo.hub_token`, `sft.args.Authorization`."""
    found: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            found += [path] if is_secret_name(key) or is_secret_value(value) else secret_paths(value, path)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += [f"{prefix}[{i}]"] if is_secret_value(value) else secret_paths(value, f"{prefix}[{i}]")
    return found


def redact_secrets(obj: Any) -> Any:
    """`obj` with every secret (`secret_paths`' keys and values) replaced by `REDACTED` (dicts and lists, any
    depth): what a public reader of a run shows, should a secret have reached its files anyway."""
    if isinstance(obj, dict):
        return {k: REDACTED if is_secret_name(k) or is_secret_value(v) else redact_secrets(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_secrets(v) for v in obj]
    return REDACTED if is_secret_value(obj) else obj
