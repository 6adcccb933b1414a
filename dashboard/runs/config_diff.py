"""Two runs' configs, field by field: the keys whose values differ (what W&B's and LlamaBoard's run comparison shows).

Configs are flattened first, nested sections under dotted names (`grpo.loss_type`, `sft.args.lr_scheduler_type`), so
a change deep in a pass-through section is one row, not a whole differing section. Lists are compared and shown
whole (`sft.teacher_mistakes`): an element has no name of its own. A key one run lacks (a field added since it was
written) shows as absent, not as null. Pure functions on dicts (`diff_configs`, `diff_table`): the caller passes
configs already redacted (`dashboard.core.run_data.RunCache` redacts secrets, by key name and by value), so nothing
here can show one. The Runs tab's "Config diff" view (`config_diff_controls`) takes its configs from the run cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from dashboard.access import inputs as checked
from dashboard.core.context import AppContext
from dashboard.core.run_data import RunCache
from dashboard.core.transcripts import esc

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


DIFF_EMPTY_HEADERS = ["field", "run A", "run B"]


def config_diff_view(runs: RunCache, name_a: Any, name_b: Any) -> tuple[str, pd.DataFrame]:
    """(message HTML, table) of the config fields that differ between two listed runs. A public event: names from
    the page must be runs the app lists (never a path; `RunCache.list` then `try_snapshot`'s `resolve_run`), and
    configs come from the cache, secret-named values already redacted."""
    empty = pd.DataFrame(columns=DIFF_EMPTY_HEADERS)
    if not name_a or not name_b:
        return '<div class="sqe-muted">Pick two runs to see the config fields that differ.</div>', empty
    try:
        names = [checked.name(v, "Run") for v in (name_a, name_b)]
    except checked.InputRefused as exc:
        return f'<div class="sqe-err-box">{esc(exc)}</div>', empty
    listed = {r["run_id"] for r in runs.list()}
    configs = []
    for name in names:
        if name not in listed:
            return f'<div class="sqe-err-box">No run named {esc(checked.quote(name))} is listed.</div>', empty
        snap, err = runs.try_snapshot(name)
        if snap is None or snap.config is None:
            why = err if snap is None else snap.config_error
            return f'<div class="sqe-err-box">{esc(name)}: {esc(why)}</div>', empty
        configs.append(snap.config)
    rows = diff_configs(*configs)
    fields = len((flatten(configs[0]).keys() | flatten(configs[1]).keys()) - set(IDENTITY_KEYS))
    pair = f"<b>{esc(names[0])}</b> and <b>{esc(names[1])}</b>"
    ignored = f"{' and '.join(IDENTITY_KEYS)}, each run's own folder, left out"
    if not rows:
        message = f"{pair} have the same config: all {fields} fields equal ({ignored})."
        return f'<div class="sqe-ok-box" id="runs-diff-summary" data-differ="0">{message}</div>', empty
    message = f"{len(rows)} of {fields} config fields differ between {pair} ({ignored})."
    return (f'<div class="sqe-muted" id="runs-diff-summary" data-differ="{len(rows)}">{message}</div>',
            diff_table(rows, f"A: {names[0]}", f"B: {names[1]}"))


def config_diff_controls(ctx: AppContext) -> tuple[Any, Any]:
    """The Config diff tab: two run pickers and the fields that differ. Returns the pickers (the run list fills
    them)."""
    with gr.Row():
        diff_a = gr.Dropdown([], label="Run A", elem_id="runs-diff-a")
        diff_b = gr.Dropdown([], label="Run B", elem_id="runs-diff-b")
    message = gr.HTML('<div class="sqe-muted">Pick two runs to see the config fields that differ.</div>',
                      elem_id="runs-diff-message")
    table = gr.Dataframe(pd.DataFrame(columns=DIFF_EMPTY_HEADERS), interactive=False, wrap=True,
                         label="Config fields that differ (nested sections as dotted names)", elem_id="runs-diff")

    def show_diff(a, b):
        return config_diff_view(ctx.runs, a, b)

    for dropdown in (diff_a, diff_b):
        # .input: a person picked (a refresh that keeps both values changes nothing to diff again).
        dropdown.input(show_diff, inputs=[diff_a, diff_b], outputs=[message, table], show_progress="hidden")
    return diff_a, diff_b
