"""Plotly figures built from run-directory records (pure functions: records in, figure out).

A figure is plotly's own JSON form, `{"data": [traces], "layout": {...}}`, built as plain dicts: the pages
rebuild charts while a run trains in the same process, and constructing `plotly.graph_objects.Figure`s
(which validates every property) cost ~200 ms of the GIL per chart, a tax on the training thread; plain
dicts cost well under a millisecond. `go.Figure(fig)` turns one into a Figure when wanted; `plot_data(fig)`
hands it to `gr.Plot`.

Every builder takes the plain dicts that `training.run_dir.RunDir.read(...)` returns and never raises on odd
records: a value that is missing, None, NaN or not a number is skipped, so a half-written or hand-edited run
still plots what it can.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

Figure = dict[str, Any]

# One colour per concept, reused across charts so "eval" or "correctness" always looks the same.
COLORS = {
    "reward": "#4f46e5",
    "reward_correctness": "#16a34a",
    "reward_progress": "#f59e0b",
    "reward_operational": "#0ea5e9",
    "train": "#4f46e5",
    "eval": "#16a34a",
    "eval_unseen_db": "#db2777",
    "rollout": "#94a3b8",
    "tools/call_frequency": "#4f46e5",
    "tools/failure_frequency": "#dc2626",
    "completions/clipped_ratio": "#f59e0b",
    "frac_reward_zero_std": "#64748b",
}
PALETTE = ["#4f46e5", "#16a34a", "#dc2626", "#f59e0b", "#0ea5e9", "#db2777", "#64748b", "#7c3aed"]
TOOL_HEALTH_KEYS = (
    ("tools/call_frequency", "tool calls / sample"),
    ("tools/failure_frequency", "tool failure rate"),
    ("completions/clipped_ratio", "clipped completions"),
    ("frac_reward_zero_std", "zero-std groups"),
)
CHART_HEIGHT = 320


def as_float(value: Any) -> float | None:
    """A finite float, or None for anything that is not one (None, NaN, strings, bools)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def series(records: Iterable[dict[str, Any]], key: str, x_key: str = "step") -> tuple[list[float], list[float]]:
    """(x, y) of every record that has a numeric `key` and a numeric `x_key`, sorted by x."""
    points = []
    for record in records:
        if not isinstance(record, dict):
            continue
        x, y = as_float(record.get(x_key)), as_float(record.get(key))
        if x is not None and y is not None:
            points.append((x, y))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


def reward_components(records: Iterable[dict[str, Any]]) -> list[str]:
    """Names of the reward functions TRL logged (`rewards/<name>/mean`), in first-seen order."""
    names: list[str] = []
    for record in records:
        if not isinstance(record, dict):
            continue
        for key in record:
            if key.startswith("rewards/") and key.endswith("/mean"):
                name = key[len("rewards/") : -len("/mean")]
                if name not in names:
                    names.append(name)
    return names


def last_step(records: Iterable[dict[str, Any]]) -> int | None:
    """The largest numeric `step` among the records (the newest point a chart shows)."""
    steps = [as_float(r.get("step")) for r in records if isinstance(r, dict)]
    steps = [s for s in steps if s is not None]
    return int(max(steps)) if steps else None


# plotly_white, inlined: a named template only exists in Python, the browser gets the JSON.
# Margins are fixed (see _layout), not grown to fit the tick labels: automargin makes every redraw measure the
# labels (forced layouts), a large part of a live chart's update cost in the browser.
_AXIS = {"gridcolor": "#EBF0F8", "zerolinecolor": "#EBF0F8", "linecolor": "#EBF0F8", "automargin": False,
         "ticks": "", "zerolinewidth": 2, "title": {"standoff": 8}}


def scatter(x, y, name: str, **props: Any) -> dict[str, Any]:
    return {"type": "scatter", "x": list(x), "y": list(y), "name": name, **props}


def _layout(data: list[dict], title: str, y_title: str, empty_note: str | None = None,
            **extra: Any) -> Figure:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "height": CHART_HEIGHT,
        "margin": {"l": 55, "r": 15, "t": 70, "b": 45},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "font": {"color": "#2a3f5f"},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0.0, "font": {"size": 11}},
        "hovermode": "x unified",
        "xaxis": {**_AXIS, "title": {"text": "step"}},
        "yaxis": {**_AXIS, "title": {"text": y_title}},
    }
    xs = [x for trace in data for x in trace.get("x", ()) if isinstance(x, (int, float))]
    if xs and max(xs) - min(xs) < 10:
        layout["xaxis"]["dtick"] = 1  # a young run: whole steps, not 1.5
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    if empty_note:
        layout["annotations"] = [{
            "text": empty_note, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
            "font": {"size": 13, "color": "#64748b"},
        }]
        layout["xaxis"]["showticklabels"] = False
        layout["yaxis"]["showticklabels"] = False
    return {"data": data, "layout": layout}


def plot_data(fig: Figure):
    """The figure as Gradio's plot payload (plotly JSON, no Figure object in between)."""
    from gradio.components.plot import PlotData

    return PlotData(type="plotly", plot=json.dumps(fig, allow_nan=False, default=str))


def reward_figure(metrics: list[dict[str, Any]], title: str = "Reward") -> Figure:
    """Mean reward per logged step with a ± std band, plus each reward function's mean."""
    data = []
    x, mean = series(metrics, "reward")
    if x:
        std_by_x = dict(zip(*series(metrics, "reward_std")))
        upper = [m + std_by_x.get(xi, 0.0) for xi, m in zip(x, mean)]
        lower = [m - std_by_x.get(xi, 0.0) for xi, m in zip(x, mean)]
        data.append(scatter(x + x[::-1], upper + lower[::-1], "± std", fill="toself",
                            fillcolor="rgba(79,70,229,0.14)", line={"width": 0}, hoverinfo="skip"))
        data.append(scatter(x, mean, "reward (mean)", mode="lines+markers",
                            line={"color": COLORS["reward"], "width": 2.5}, marker={"size": 5}))
    for i, name in enumerate(reward_components(metrics)):
        cx, cy = series(metrics, f"rewards/{name}/mean")
        if cx:
            data.append(scatter(cx, cy, name.removeprefix("reward_"), mode="lines", line={
                "color": COLORS.get(name, PALETTE[(i + 2) % len(PALETTE)]), "width": 1.5, "dash": "dot"}))
    return _layout(data, title, "reward", None if data else "waiting for the first logged step…")


def success_figure(
    evals: list[dict[str, Any]], metrics: list[dict[str, Any]] | None = None, title: str = "Success rate"
) -> Figure:
    """Greedy-episode success rate per split (train vs eval) from evals.jsonl; the rollouts' correctness
    reward (a sampled, noisier view of the same thing) is drawn faintly behind when metrics are given."""
    data = []
    if metrics:
        rx, ry = series(metrics, "rewards/reward_correctness/mean")
        if rx:
            data.append(scatter(rx, ry, "rollouts (sampled)", mode="lines",
                                line={"color": COLORS["rollout"], "width": 1, "dash": "dot"}))
    splits: list[str] = []
    for record in evals:
        split = record.get("split") if isinstance(record, dict) else None
        if isinstance(split, str) and split not in splits:
            splits.append(split)
    for i, split in enumerate(splits):
        sx, sy = series([r for r in evals if isinstance(r, dict) and r.get("split") == split], "success_rate")
        if sx:
            data.append(scatter(sx, sy, f"{split} split", mode="lines+markers", marker={"size": 7},
                                line={"color": COLORS.get(split, PALETTE[i % len(PALETTE)]), "width": 2.5}))
    return _layout(data, title, "success", None if data else "no evaluation yet",
                   yaxis={"range": [-0.03, 1.03], "tickformat": ".0%"})


def tool_health_figure(metrics: list[dict[str, Any]], title: str = "Tool health") -> Figure:
    """The signals that say why a run is not learning: tool calls per sample, tool failure rate, clipped
    completions, and the fraction of groups whose rewards all tie (no GRPO advantage)."""
    data = []
    for key, label in TOOL_HEALTH_KEYS:
        x, y = series(metrics, key)
        if x:
            # Calls per sample is a count (0..budget); the others are fractions: give it the right-hand axis.
            count = key == "tools/call_frequency"
            data.append(scatter(x, y, label + (" (right axis)" if count else ""), mode="lines+markers",
                                line={"color": COLORS[key], "width": 2, "dash": "dash" if count else "solid"},
                                marker={"size": 4}, yaxis="y2" if count else "y"))
    extra: dict[str, Any] = {"yaxis": {"range": [-0.03, 1.03], "tickformat": ".0%"}}
    if data:
        extra["yaxis2"] = {"title": {"text": "calls / sample"}, "overlaying": "y", "side": "right",
                           "rangemode": "tozero", "showgrid": False, "automargin": False}
        extra["margin"] = {"r": 55}
    return _layout(data, title, "fraction", None if data else "no tool metrics logged yet", **extra)


def overlay_figure(
    runs: dict[str, list[dict[str, Any]]], key: str, title: str, y_title: str,
    split: str | None = None, as_percent: bool = False,
) -> Figure:
    """One line per run for `key` (records filtered to `split` when given): compare runs at a glance."""
    data = []
    for i, (name, records) in enumerate(runs.items()):
        if split is not None:
            records = [r for r in records if isinstance(r, dict) and r.get("split") == split]
        x, y = series(records, key)
        if x:
            data.append(scatter(x, y, name, mode="lines+markers", marker={"size": 4},
                                line={"color": PALETTE[i % len(PALETTE)], "width": 2}))
    extra = {"yaxis": {"range": [-0.03, 1.03], "tickformat": ".0%"}} if as_percent else {}
    return _layout(data, title, y_title, None if data else "nothing to overlay: select runs with data", **extra)


def reward_overlay(runs_metrics: dict[str, list[dict[str, Any]]]) -> Figure:
    return overlay_figure(runs_metrics, "reward", "Reward (mean) by run", "reward")


def success_overlay(runs_evals: dict[str, list[dict[str, Any]]], split: str = "eval") -> Figure:
    return overlay_figure(
        runs_evals, "success_rate", f"Success rate on the {split} split by run", "success", split=split,
        as_percent=True,
    )
