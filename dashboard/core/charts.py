"""Plotly figures built from run-directory records (pure functions: records in, figure out).

A figure is plotly's own JSON form, `{"data": [traces], "layout": {...}}`, built as plain dicts: the pages
rebuild charts while a run trains in the same process, and constructing `plotly.graph_objects.Figure`s
(which validates every property) cost ~200 ms of the GIL per chart, a tax on the training thread; plain
dicts cost well under a millisecond. `go.Figure(fig)` turns one into a Figure when wanted; `plot_data(fig)`
hands it to `gr.Plot`.

Every builder takes the plain dicts that `training.run.directory.RunDir.read(...)` returns and never raises on odd
records: a value that is missing, None, NaN or not a number is skipped, so a half-written or hand-edited run
still plots what it can.

A run has phases (`"phase"` on every record: the SFT warm-start, then GRPO), each counting its own steps. The run
charts give each phase that has records its own panel with its own step axis, side by side (warm start left,
GRPO right): on one time axis the warm start, which takes most of the wall time, squeezed GRPO into the right
edge. Given the run's start `t0` (epoch seconds), each point's hover also says its minutes since the start.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from dashboard.core.formatting import as_float
from training.run.schema import GRPO, SFT, TRAINER_PHASES

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
    "groups_mixed_success_frac": "#16a34a",
    "sft_loss": "#7c3aed",
    "mean_token_accuracy": "#7c3aed",
}
PALETTE = ["#4f46e5", "#16a34a", "#dc2626", "#f59e0b", "#0ea5e9", "#db2777", "#64748b", "#7c3aed"]
TOOL_HEALTH_KEYS = (
    ("tools/call_frequency", "tool calls / sample"),
    ("tools/failure_frequency", "tool failure rate"),
    ("completions/clipped_ratio", "clipped completions"),
    ("frac_reward_zero_std", "zero-std groups"),
    ("groups_mixed_success_frac", "mixed-success groups"),
)
CHART_HEIGHT = 400
#: The phases with a panel of their own (those that log steps, `training.run.schema`), in run order, and their step
#: axes' titles.
STEP_AXIS_TITLES = {SFT: "warm start (SFT) step", GRPO: "GRPO step"}
PHASE_PANELS = tuple((phase, STEP_AXIS_TITLES[phase]) for phase in TRAINER_PHASES)


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


def step_series(records: Iterable[dict[str, Any]], key: str, t0: float | None = None,
                extra: str | None = None) -> tuple[list[float], list[float], list[list[Any]]]:
    """(steps, values, per-point [minutes since `t0` or None, the record's `extra` field or None]) of every record
    with a numeric `step` and `key`, sorted by step: a phase panel's points and what their hover adds."""
    points = []
    for record in records:
        if not isinstance(record, dict):
            continue
        x, y = as_float(record.get("step")), as_float(record.get(key))
        if x is not None and y is not None:
            minutes = minutes_since(record, t0) if t0 is not None else None
            points.append((x, y, [minutes, record.get(extra) if extra else None]))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def log_ticks(values: Iterable[float]) -> tuple[list[float], list[str]]:
    """Tick values and their labels for a log axis over `values` (positive ones): 1, 2 and 5 × 10^n when the values
    span at most two decades, else decades only; always at least one tick at or below the smallest value and one
    at or above the largest, so the axis reads as plain numbers ("0.5 1 2 5"), never plotly's bare minor digits."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return [], []
    lo, hi = min(positive), max(positive)
    mantissas = (1, 2, 5) if math.log10(hi / lo) <= 2 else (1,)
    candidates = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
                  for m in mantissas]
    below = max(c for c in candidates if c <= lo * (1 + 1e-9))
    above = min(c for c in candidates if c >= hi * (1 - 1e-9))
    ticks = [float(f"{c:.6g}") for c in candidates if below * (1 - 1e-9) <= c <= above * (1 + 1e-9)]
    if len(ticks) == 1:  # every value equal to one tick: one more above, so the axis has a scale
        ticks.append(min(c for c in candidates if c > ticks[0] * (1 + 1e-9)))
    return ticks, [f"{t:g}" for t in ticks]


def minutes_since(record: dict[str, Any], t0: float) -> float | None:
    """Minutes from `t0` to the record's `time` (epoch seconds), or None when it has none."""
    t = as_float(record.get("time"))
    return round((t - t0) / 60.0, 3) if t is not None else None


def in_phase(records: Iterable[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    """The records of `phase`; records written before runs had phases count as GRPO's."""
    return [r for r in records if isinstance(r, dict) and r.get("phase", "grpo") == phase]


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


#: The legend's top, in plot heights under the plot: ~66 px, below the tick labels and the x-axis title (which
#: end ~55 px under the plot).
LEGEND_Y = -0.28
#: A legend row's height, and the rows the bottom margin holds before the figure grows.
LEGEND_ROW_PX, LEGEND_ROWS_IN_MARGIN = 29, 2
#: The width a legend row has in the narrowest chart the dashboard draws (three charts across a 1440 px window:
#: ~300 px), less a margin: a row too many leaves blank space, a row too few is cut off at the figure's bottom.
LEGEND_ROW_WIDTH_PX = 270


def legend_rows(data: list[dict[str, Any]]) -> int:
    """The rows plotly's horizontal legend takes for these traces in the narrowest chart, erring high: entries are
    packed left to right, each ~45 px of symbol and gaps plus ~6 px a character at font size 11."""
    rows, used = 0, float(LEGEND_ROW_WIDTH_PX)
    for trace in data:
        if trace.get("showlegend") is False or not trace.get("name"):
            continue
        width = 45 + 6.0 * len(str(trace["name"]))
        if used + width > LEGEND_ROW_WIDTH_PX:
            rows, used = rows + 1, 0.0
        used += width
    return rows


def scatter(x, y, name: str, **props: Any) -> dict[str, Any]:
    return {"type": "scatter", "x": list(x), "y": list(y), "name": name, **props}


def _layout(data: list[dict], title: str, y_title: str, empty_note: str | None = None,
            x_title: str = "step", **extra: Any) -> Figure:
    grown = max(0, legend_rows(data) - LEGEND_ROWS_IN_MARGIN) * LEGEND_ROW_PX
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "font": {"size": 15}},
        "height": CHART_HEIGHT + grown,
        # The bottom margin holds the tick labels, the x-axis title under them, then the legend (see "legend").
        # It is not pushed by the legend (autoexpand): a pushed margin shrinks the plot, and with it the legend's
        # distance under the plot (LEGEND_Y is in plot heights), into the axis titles. A legend of more rows than
        # the margin holds grows the figure instead, so the plot area stays 235 px tall.
        "margin": {"l": 55, "r": 15, "t": 40, "b": 125 + grown, "autoexpand": False},
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "font": {"color": "#2a3f5f"},
        # Below the plot: above it, a legend of several rows ran over the title.
        "legend": {"orientation": "h", "yanchor": "top", "y": LEGEND_Y, "x": 0.0, "font": {"size": 11}},
        "hovermode": "x unified",
        "xaxis": {**_AXIS, "title": {"text": x_title}},
        "yaxis": {**_AXIS, "title": {"text": y_title}},
    }
    xs = [x for trace in data for x in trace.get("x", ()) if isinstance(x, (int, float))]
    if xs and max(xs) - min(xs) < 10 and x_title == "step":
        layout["xaxis"]["dtick"] = 1  # a young run: whole steps, not 1.5
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
    from gradio.components.plot import PlotData  # here: the figure builders above need no gradio

    return PlotData(type="plotly", plot=json.dumps(fig, allow_nan=False, default=str))


# Where the panels sit (fractions of the plot width): one phase takes it all; with two, the warm start gets the
# narrower left part (GRPO is what the run is for) and the gap holds the GRPO panel's y-axis labels and title.
PANEL_DOMAINS = {1: [(0.0, 1.0)], 2: [(0.0, 0.40), (0.56, 1.0)]}


def hover_template(fmt: str, minutes: bool, episodes: bool = False) -> str:
    """A phase panel point's hover: its value and step, plus its minutes since the run's start (customdata[0])
    and an eval's episode count (customdata[1]) when asked."""
    text = f"%{{y:{fmt}}} · step %{{x}}"
    if minutes:
        text += " · minute %{customdata[0]:.1f}"
    if episodes:
        text += " · %{customdata[1]} episodes"
    return text


def phase_panels_figure(panels: list[dict[str, Any]], title: str, empty_note: str) -> Figure:
    """A figure of one panel per phase that has traces, side by side, each with its own step axis.

    Each panel is {"phase", "traces", "y_title", "yaxis" (extra left-axis settings), optional "right_axis" (the
    settings of a right-hand axis)}; a trace goes on the left axis, or with `"yaxis": "right"` on the right-hand
    one. Traces get their axis ids here; a trace name that repeats in a later panel (one legend group) is listed
    once."""
    panels = [p for p in panels if p.get("traces")]
    if not panels:
        return _layout([], title, "", empty_note, x_title="")
    titles = dict(PHASE_PANELS)
    data: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    next_y = 1
    listed: set[str] = set()
    has_right = False
    for i, (panel, domain) in enumerate(zip(panels, PANEL_DOMAINS[min(len(panels), 2)])):
        x_id = "x" if i == 0 else f"x{i + 1}"
        y_id = "y" if next_y == 1 else f"y{next_y}"
        next_y += 1
        right_id = None
        if any(t.get("yaxis") == "right" for t in panel["traces"]):
            right_id = f"y{next_y}"
            next_y += 1
        for trace in panel["traces"]:
            group = trace.get("legendgroup") or trace.get("name")
            data.append({**trace, "xaxis": x_id, "yaxis": right_id if trace.get("yaxis") == "right" else y_id,
                         "legendgroup": group, "showlegend": group not in listed})
            listed.add(group)
        xs = [x for t in panel["traces"] for x in t.get("x", ()) if isinstance(x, (int, float))]
        x_axis: dict[str, Any] = {**_AXIS, "title": {"text": titles.get(panel["phase"], "step")},
                                  "domain": list(domain), "anchor": y_id}
        if xs and max(xs) - min(xs) < 10:
            x_axis["dtick"] = 1  # a young phase: whole steps, not 1.5
        elif len(panels) > 1:
            x_axis["nticks"] = 4  # a narrow panel: few labels, so "1000 2000 ... 5000" are not turned on their side
        axes["xaxis" if i == 0 else f"xaxis{i + 1}"] = x_axis
        axes["yaxis" if y_id == "y" else f"yaxis{y_id[1:]}"] = {
            **_AXIS, "title": {"text": panel.get("y_title", "")}, "anchor": x_id, **(panel.get("yaxis") or {})}
        if right_id is not None:
            has_right = True
            axes[f"yaxis{right_id[1:]}"] = {**_AXIS, "overlaying": y_id, "side": "right", "anchor": x_id,
                                            "showgrid": False, **(panel.get("right_axis") or {})}
    layout_extra: dict[str, Any] = {"margin": {"r": 55}} if has_right else {}
    fig = _layout(data, title, "", None, **layout_extra)
    fig["layout"].update(axes)
    return fig


def reward_figure(metrics: list[dict[str, Any]], title: str = "Learning signal", t0: float | None = None) -> Figure:
    """The warm start's SFT loss per SFT step (log scale, readable ticks: `log_ticks`), then GRPO's mean reward per
    GRPO step with a ± std band and each reward function's mean: one panel per phase (see the module docstring);
    with `t0`, each point's hover says its minutes since the start."""
    minutes = t0 is not None
    grpo_traces = []
    grpo = in_phase(metrics, "grpo")
    x, mean, custom = step_series(grpo, "reward", t0=t0)
    if x:
        std_by_x = dict(zip(*step_series(grpo, "reward_std")[:2]))
        upper = [m + std_by_x.get(xi, 0.0) for xi, m in zip(x, mean)]
        lower = [m - std_by_x.get(xi, 0.0) for xi, m in zip(x, mean)]
        grpo_traces.append(scatter(x + x[::-1], upper + lower[::-1], "± std", fill="toself",
                                   fillcolor="rgba(79,70,229,0.14)", line={"width": 0}, hoverinfo="skip"))
        grpo_traces.append(scatter(x, mean, "reward (mean)", mode="lines+markers", customdata=custom,
                                   hovertemplate=hover_template(".3f", minutes),
                                   line={"color": COLORS["reward"], "width": 2.5}, marker={"size": 5}))
    for i, name in enumerate(reward_components(grpo)):
        cx, cy, custom = step_series(grpo, f"rewards/{name}/mean", t0=t0)
        if cx:
            grpo_traces.append(scatter(cx, cy, name.removeprefix("reward_"), mode="lines", customdata=custom,
                                       hovertemplate=hover_template(".3f", minutes), line={
                                           "color": COLORS.get(name, PALETTE[(i + 2) % len(PALETTE)]), "width": 1.5,
                                           "dash": "dot"}))
    lx, loss, custom = step_series(in_phase(metrics, "sft"), "loss", t0=t0)
    sft_traces = []
    sft_axis: dict[str, Any] = {}
    if lx:
        sft_traces.append(scatter(lx, loss, "SFT loss", mode="lines", customdata=custom,
                                  hovertemplate=hover_template(".3g", minutes),
                                  line={"color": COLORS["sft_loss"], "width": 2}))
        tickvals, ticktext = log_ticks(loss)
        sft_axis = {"type": "log", "tickmode": "array", "tickvals": tickvals, "ticktext": ticktext,
                    "range": [math.log10(tickvals[0]), math.log10(tickvals[-1])]} if tickvals else {"type": "log"}
    return phase_panels_figure([
        {"phase": "sft", "traces": sft_traces, "y_title": "SFT loss (log)", "yaxis": sft_axis},
        {"phase": "grpo", "traces": grpo_traces, "y_title": "GRPO reward"},
    ], title, "waiting for the first logged step…")


def eval_sizes(evals: Iterable[dict[str, Any]]) -> str:
    """How many episodes the evals played, for a label: "32", "4–32" when evals differ (the warm start's first
    eval plays only a few), "" when the records do not say."""
    sizes = sorted({int(n) for r in evals if isinstance(r, dict) and (n := as_float(r.get("n_episodes")))})
    if not sizes:
        return ""
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"


def success_figure(
    evals: list[dict[str, Any]], metrics: list[dict[str, Any]] | None = None, title: str = "Success rate",
    t0: float | None = None,
) -> Figure:
    """Greedy-episode success rate per split (train vs eval) from evals.jsonl, one panel per phase (the warm start,
    GRPO); each split's legend entry says how many episodes an eval plays. The rollouts' correctness reward (a
    sampled, noisier view of the same thing) is drawn faintly behind in the GRPO panel when metrics are given."""
    minutes = t0 is not None
    splits: list[str] = []
    for record in evals:
        split = record.get("split") if isinstance(record, dict) else None
        if isinstance(split, str) and split not in splits:
            splits.append(split)
    eval_split = "eval" if "eval" in splits else (splits[-1] if splits else None)
    labels = {}
    for split in splits:
        size = eval_sizes(r for r in evals if isinstance(r, dict) and r.get("split") == split)
        labels[split] = f"{split} split ({size} episodes)" if size else f"{split} split"
    panels = []
    for phase, _ in PHASE_PANELS:
        records = in_phase(evals, phase)
        traces = []
        if phase == "grpo" and metrics:
            rx, ry, custom = step_series(in_phase(metrics, "grpo"), "rewards/reward_correctness/mean", t0=t0)
            if rx:
                traces.append(scatter(rx, ry, "rollouts (sampled)", mode="lines", customdata=custom,
                                      hovertemplate=hover_template(".0%", minutes),
                                      line={"color": COLORS["rollout"], "width": 1, "dash": "dot"}))
        for i, split in enumerate(splits):
            of_split = [r for r in records if r.get("split") == split]
            sx, sy, custom = step_series(of_split, "success_rate", t0=t0, extra="n_episodes")
            if sx:
                traces.append(scatter(sx, sy, labels[split], mode="lines+markers", marker={"size": 7},
                                      customdata=custom, hovertemplate=hover_template(".0%", minutes, episodes=True),
                                      line={"color": COLORS.get(split, PALETTE[i % len(PALETTE)]), "width": 2.5}))
        # Whether the agent looks at the data before answering: what the warm start's guesses lack and GRPO teaches.
        if eval_split is not None:
            ex, ey, custom = step_series([r for r in records if r.get("split") == eval_split], "explore_rate",
                                         t0=t0)
            if ex:
                traces.append(scatter(ex, ey, f"{eval_split}: looked before answering", mode="lines",
                                      customdata=custom, hovertemplate=hover_template(".0%", minutes), line={
                                          "color": COLORS.get(eval_split, PALETTE[0]), "width": 1.5, "dash": "dot"}))
        panels.append({"phase": phase, "traces": traces, "y_title": "success",
                       "yaxis": {"range": [-0.03, 1.03], "tickformat": ".0%"}})
    return phase_panels_figure(panels, title, "no evaluation yet")


def tool_health_figure(metrics: list[dict[str, Any]], title: str = "Health", t0: float | None = None) -> Figure:
    """The signals that say why a run is or is not learning: during the warm start, the share of assistant
    tokens the model predicts right (SFT token accuracy); during GRPO, tool calls per sample, tool failure rate,
    clipped completions, the fraction of groups whose rewards all tie (no GRPO advantage), and the fraction whose
    episodes' success is mixed (some right, some wrong: the groups that teach what a correct answer is;
    `training.grpo.sampler`). One panel per phase (see the module docstring)."""
    minutes = t0 is not None
    ax, acc, custom = step_series(in_phase(metrics, "sft"), "mean_token_accuracy", t0=t0)
    sft_traces = []
    if ax:
        sft_traces.append(scatter(ax, acc, "SFT token accuracy", mode="lines", customdata=custom,
                                  hovertemplate=hover_template(".0%", minutes),
                                  line={"color": COLORS["mean_token_accuracy"], "width": 2}))
    grpo = in_phase(metrics, "grpo")
    grpo_traces = []
    for key, label in TOOL_HEALTH_KEYS:
        x, y, custom = step_series(grpo, key, t0=t0)
        if x:
            # Calls per sample is a count (0..budget); the others are fractions: give it the right-hand axis.
            count = key == "tools/call_frequency"
            grpo_traces.append(scatter(
                x, y, label + (" (right axis)" if count else ""), mode="lines+markers", customdata=custom,
                hovertemplate=hover_template(".2f" if count else ".0%", minutes), yaxis="right" if count else "left",
                line={"color": COLORS[key], "width": 2, "dash": "dash" if count else "solid"}, marker={"size": 4}))
    percent = {"range": [-0.03, 1.03], "tickformat": ".0%"}
    return phase_panels_figure([
        {"phase": "sft", "traces": sft_traces, "y_title": "fraction", "yaxis": percent},
        {"phase": "grpo", "traces": grpo_traces, "y_title": "fraction", "yaxis": percent,
         "right_axis": {"title": {"text": "calls / sample"}, "rangemode": "tozero", "tickformat": ".1f"}},
    ], title, "no health metrics logged yet")


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
