"""Two runs' configs, field by field: the keys whose values differ (what W&B's and LlamaBoard's run comparison shows).

Configs are flattened first, nested sections under dotted names (`grpo.loss_type`, `sft.args.lr_scheduler_type`), so
a change deep in a pass-through section is one row, not a whole differing section. Lists are compared and shown
whole (`sft.teacher_mistakes`): an element has no name of its own. A key one run lacks (a field added since it was
written) shows as absent, not as null. Pure functions on dicts: the caller passes configs already redacted
(`dashboard.run_data.RunCache` redacts secrets, by key name and by value), so nothing here can show one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

#: What a row shows for a key the run's config lacks (distinct from a JSON null).
ABSENT = "(absent)"
#: Keys that name the run itself (its folder), not how it trains: they differ between any two runs, so leaving them
#: in would never let two runs with the same settings read as equal.
IDENTITY_KEYS = ("run_id", "output_dir")


@dataclass(frozen=True)
class FieldDiff:
    key: str
    a: Any
    b: Any
    a_present: bool = True
    b_present: bool = True


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"sft": {"args": {"x": 1}}}` -> `{"sft.args.x": 1}`. An empty section (`"grpo": {}`: nothing passed
    through) adds no key: its fields set in the other run already show as rows of their own."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 == 1.0 is the same setting, but True is not 1 (bool is an int in Python).
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def diff_configs(a: dict[str, Any], b: dict[str, Any], ignore: tuple[str, ...] = IDENTITY_KEYS) -> list[FieldDiff]:
    """The flattened fields whose values differ between `a` and `b` (or that one of them lacks), sorted by key;
    top-level keys in `ignore` are left out."""
    flat_a, flat_b = flatten(a), flatten(b)
    rows = []
    for key in sorted((flat_a.keys() | flat_b.keys()) - set(ignore)):
        in_a, in_b = key in flat_a, key in flat_b
        if in_a and in_b and _same(flat_a[key], flat_b[key]):
            continue
        rows.append(FieldDiff(key, flat_a.get(key), flat_b.get(key), in_a, in_b))
    return rows


def show_value(value: Any, present: bool = True) -> str:
    """A value as the config file writes it (JSON: strings quoted, so "1" and 1 read differently)."""
    if not present:
        return ABSENT
    return json.dumps(value, default=str, ensure_ascii=False)


def diff_table(rows: list[FieldDiff], label_a: str, label_b: str) -> pd.DataFrame:
    """The differing fields as a table: field, run A's value, run B's value."""
    return pd.DataFrame([[r.key, show_value(r.a, r.a_present), show_value(r.b, r.b_present)] for r in rows],
                        columns=["field", label_a, label_b])
