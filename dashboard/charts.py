"""Plotly figures built from run-directory records (pure functions: records in, figure out).

A figure is plotly's own JSON form, `{"data": [traces], "layout": {...}}`, built as plain dicts: the pages
rebuild charts while a run trains in the same process, and constructing `plotly.graph_objects.Figure`s
(which validates every property) cost ~200 ms of the GIL per chart, a tax on the training thread; plain
dicts cost well under a millisecond. `go.Figure(fig)` turns one into a Figure when wanted; `plot_data(fig)`
hands it to `gr.Plot`.

Every builder takes the plain dicts that `training.run_dir.RunDir.read(...)` returns and never raises on odd
records: a value that is missing, None, NaN or not a number is skipped, so a half-written or hand-edited run
still plots what it can.

A run has phases (`"phase"` on every record: the SFT warm-start, then GRPO), each counting its own steps. Given
the run's start `t0` (epoch seconds), the run charts put every record on one timeline, minutes since the start,
so the warm start's loss and the GRPO reward, and the success rate across both, read left to right; without it
they plot by step.
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
    "sft_loss": "#7c3aed",
    "mean_token_accuracy": "#7c3aed",
}
PALETTE = ["#4f46e5", "#16a34a", "#dc2626", "#f59e0b", "#0ea5e9", "#db2777", "#64748b", "#7c3aed"]
TOOL_HEALTH_KEYS = (
    ("tools/call_frequency", "tool calls / sample"),
    ("tools/failure_frequency", "tool failure rate"),
    ("completions/clipped_ratio", "clipped completions"),
    ("frac_reward_zero_std", "zero-std groups"),
)
CHART_HEIGHT = 380


def as_float(value: Any) -> float | None:
    """A finite float, or None for anything that is not one (None, NaN, strings, bools)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def series(records: Iterable[dict[str, Any]], key: str, x_key: str = "step",
           t0: float | None = None) -> tuple[list[float], list[float]]:
    """(x, y) of every record that has a numeric `key` and a numeric x, sorted by x. The x is `x_key`, or with
    `t0` the minutes from `t0` to the record's `time`."""
    points = []
    for record in records:
        if not isinstance(record, dict):
            continue
        x = minutes_since(record, t0) if t0 is not None else as_float(record.get(x_key))
        y = as_float(record.get(key))
        if x is not None and y is not None:
            points.append((x, y))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


def minutes_since(record: dict[str, Any], t0: float) -> float | None:
    """Minutes from `t0` to the record's `time` (epoch seconds), or None when it has none."""
    t = as_float(record.get("time"))
    return round((t - t0) / 60.0, 3) if t is not None else None


def in_phase(records: Iterable[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    """The records of `phase`; records written before runs had phases count as GRPO's."""
    return [r for r in records if isinstance(r, dict) and r.get("phase", "grpo") == phase]


def phase_start(records: Iterable[dict[str, Any]], phase: str, t0: float | None) -> float | None:
    """Minutes from `t0` to the first record of `phase` (None without `t0` or such a record)."""
    if t0 is None:
        return None
    xs = [m for r in in_phase(records, phase) if (m := minutes_since(r, t0)) is not None]
    return min(xs) if xs else None


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


def last_step(records: Iterable[dict[str, Any]], phase: str | None = None) -> int | None:
    """The largest numeric `step` among the records (of `phase`, when given): the newest point a chart shows."""
    if phase is not None:
        records = in_phase(records, phase)
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
            x_title: str = "step", marker_at: float | None = None, marker_text: str = "", **extra: Any) -> Figure:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "height": CHART_HEIGHT,
        "margin": {"l": 55, "r": 15, "t": 40, "b": 105},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "font": {"color": "#2a3f5f"},
        # Below the plot: above it, a legend of several rows ran over the title.
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.2, "x": 0.0, "font": {"size": 11}},
        "hovermode": "x unified",
        "xaxis": {**_AXIS, "title": {"text": x_title}},
        "yaxis": {**_AXIS, "title": {"text": y_title}},
    }
    xs = [x for trace in data for x in trace.get("x", ()) if isinstance(x, (int, float))]
    if xs and max(xs) - min(xs) < 10 and x_title == "step":
        layout["xaxis"]["dtick"] = 1  # a young run: whole steps, not 1.5
    if marker_at is not None:  # e.g. where GRPO takes over from the warm start
        layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": marker_at, "x1": marker_at,
                             "y0": 0, "y1": 1, "line": {"color": "#94a3b8", "width": 1, "dash": "dot"}}]
        layout["annotations"] = [{"text": marker_text, "showarrow": False, "xref": "x", "yref": "paper",
                                  "x": marker_at, "y": 1.0, "xanchor": "left", "yanchor": "top",
                                  "font": {"size": 11, "color": "#64748b"}}]
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    if empty_note:
        layout["annotations"] = layout.get("annotations", []) + [{
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


def _timeline(t0: float | None) -> dict[str, Any]:
    return {"x_title": "minutes since start" if t0 is not None else "step"}


def reward_figure(metrics: list[dict[str, Any]], title: str = "Learning signal", t0: float | None = None) -> Figure:
    """The warm start's SFT loss (right axis, log scale), then GRPO's mean reward per logged step with a ± std
    band and each reward function's mean; on one timeline when `t0` is given (see the module docstring)."""
    data = []
    grpo = in_phase(metrics, "grpo")
    x, mean = series(grpo, "reward", t0=t0)
    if x:
        std_by_x = dict(zip(*series(grpo, "reward_std", t0=t0)))
        upper = [m + std_by_x.get(xi, 0.0) for xi, m in zip(x, mean)]
        lower = [m - std_by_x.get(xi, 0.0) for xi, m in zip(x, mean)]
        data.append(scatter(x + x[::-1], upper + lower[::-1], "± std", fill="toself",
                            fillcolor="rgba(79,70,229,0.14)", line={"width": 0}, hoverinfo="skip"))
        data.append(scatter(x, mean, "reward (mean)", mode="lines+markers",
                            line={"color": COLORS["reward"], "width": 2.5}, marker={"size": 5}))
    for i, name in enumerate(reward_components(grpo)):
        cx, cy = series(grpo, f"rewards/{name}/mean", t0=t0)
        if cx:
            data.append(scatter(cx, cy, name.removeprefix("reward_"), mode="lines", line={
                "color": COLORS.get(name, PALETTE[(i + 2) % len(PALETTE)]), "width": 1.5, "dash": "dot"}))
    lx, loss = series(in_phase(metrics, "sft"), "loss", t0=t0)
    extra: dict[str, Any] = {}
    if lx:
        data.append(scatter(lx, loss, "SFT loss (right axis)", mode="lines", yaxis="y2",
                            line={"color": COLORS["sft_loss"], "width": 2}))
        extra["yaxis2"] = {"title": {"text": "SFT loss"}, "overlaying": "y", "side": "right", "type": "log",
                           "dtick": "D2", "showgrid": False, "automargin": False}  # ticks at 1, 2, 5 x 10^n
        extra["margin"] = {"r": 55}
    start = phase_start(metrics, "grpo", t0) if lx else None
    return _layout(data, title, "GRPO reward", None if data else "waiting for the first logged step…",
                   marker_at=start, marker_text="GRPO →", **_timeline(t0), **extra)


def success_figure(
    evals: list[dict[str, Any]], metrics: list[dict[str, Any]] | None = None, title: str = "Success rate",
    t0: float | None = None,
) -> Figure:
    """Greedy-episode success rate per split (train vs eval) from evals.jsonl, through the warm start and GRPO
    (on one timeline when `t0` is given); the rollouts' correctness reward (a sampled, noisier view of the same
    thing) is drawn faintly behind when metrics are given."""
    data = []
    if metrics:
        rx, ry = series(in_phase(metrics, "grpo"), "rewards/reward_correctness/mean", t0=t0)
        if rx:
            data.append(scatter(rx, ry, "rollouts (sampled)", mode="lines",
                                line={"color": COLORS["rollout"], "width": 1, "dash": "dot"}))
    splits: list[str] = []
    for record in evals:
        split = record.get("split") if isinstance(record, dict) else None
        if isinstance(split, str) and split not in splits:
            splits.append(split)
    for i, split in enumerate(splits):
        sx, sy = series([r for r in evals if isinstance(r, dict) and r.get("split") == split], "success_rate",
                        t0=t0)
        if sx:
            data.append(scatter(sx, sy, f"{split} split", mode="lines+markers", marker={"size": 7},
                                line={"color": COLORS.get(split, PALETTE[i % len(PALETTE)]), "width": 2.5}))
    # Whether the agent looks at the data before answering: what the warm start's guesses lack and GRPO teaches.
    eval_split = "eval" if "eval" in splits else (splits[-1] if splits else None)
    if eval_split is not None:
        ex, ey = series([r for r in evals if isinstance(r, dict) and r.get("split") == eval_split], "explore_rate",
                        t0=t0)
        if ex:
            data.append(scatter(ex, ey, f"{eval_split}: looked before answering", mode="lines", line={
                "color": COLORS.get(eval_split, PALETTE[0]), "width": 1.5, "dash": "dot"}))
    start = phase_start(evals, "grpo", t0) if in_phase(evals, "sft") else None
    return _layout(data, title, "success", None if data else "no evaluation yet", marker_at=start,
                   marker_text="GRPO →", yaxis={"range": [-0.03, 1.03], "tickformat": ".0%"}, **_timeline(t0))


def tool_health_figure(metrics: list[dict[str, Any]], title: str = "Health", t0: float | None = None) -> Figure:
    """The signals that say why a run is or is not learning: during the warm start, the share of assistant
    tokens the model predicts right (SFT token accuracy); during GRPO, tool calls per sample, tool failure rate,
    clipped completions, and the fraction of groups whose rewards all tie (no GRPO advantage)."""
    data = []
    ax, acc = series(in_phase(metrics, "sft"), "mean_token_accuracy", t0=t0)
    if ax:
        data.append(scatter(ax, acc, "SFT token accuracy", mode="lines",
                            line={"color": COLORS["mean_token_accuracy"], "width": 2}))
    grpo = in_phase(metrics, "grpo")
    for key, label in TOOL_HEALTH_KEYS:
        x, y = series(grpo, key, t0=t0)
        if x:
            # Calls per sample is a count (0..budget); the others are fractions: give it the right-hand axis.
            count = key == "tools/call_frequency"
            data.append(scatter(x, y, label + (" (right axis)" if count else ""), mode="lines+markers",
                                line={"color": COLORS[key], "width": 2, "dash": "dash" if count else "solid"},
                                marker={"size": 4}, yaxis="y2" if count else "y"))
    extra: dict[str, Any] = {"yaxis": {"range": [-0.03, 1.03], "tickformat": ".0%"}}
    if any(t.get("yaxis") == "y2" for t in data):
        extra["yaxis2"] = {"title": {"text": "calls / sample"}, "overlaying": "y", "side": "right",
                           "rangemode": "tozero", "tickformat": ".1f", "showgrid": False, "automargin": False}
        extra["margin"] = {"r": 55}
    start = phase_start(metrics, "grpo", t0) if ax else None
    return _layout(data, title, "fraction", None if data else "no health metrics logged yet", marker_at=start,
                   marker_text="GRPO →", **_timeline(t0), **extra)


def overlay_figure(
    runs: dict[str, list[dict[str, Any]]], key: str, title: str, y_title: str,
    split: str | None = None, as_percent: bool = False,
) -> Figure:
    """One line per run for `key` (records filtered to `split` when given): compare runs at a glance."""
    data = []
    for i, (name, records) in enumerate(runs.items()):
        records = in_phase(records, "grpo")  # steps of different phases do not share an axis
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
