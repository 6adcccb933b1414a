"""The "Policy" chart: how far and how fast GRPO moves the policy, per GRPO step, beside what it buys on validation.

Drawn from the run's records (`metrics.jsonl`, `evals.jsonl`; the keys in `training.run.health`), like the other charts
of `dashboard.core.charts` (plain plotly dicts, odd values skipped):

- right-hand axis, log scale (the three span four decades): the sampled completions' mean token entropy and the KL
  from the policy at GRPO's start (nats/token; the KL only on the steps it was measured), and TRL's grad norm;
- left-hand axis, from 0: the reward std, the share of groups with mixed success (the groups that teach), and the
  validation success (markers: the held-out panel played greedily at step 0 and every `eval_every` steps).

The status bar (`dashboard.train.status`) says in words what `training.run.health` reads as a collapse in these lines.
"""

from __future__ import annotations

from typing import Any

from dashboard.core.charts import (COLORS, Figure, hover_template, in_phase, log_ticks, phase_panels_figure, scatter,
                              step_series)
from training.run.health import ENTROPY_KEY, KL_KEY, VALIDATION_SPLIT

__all__ = ["policy_figure", "POLICY_KEYS"]

#: The validation markers' colour: dark, apart from the lines (the mixed-groups line has the eval split's green).
VALIDATION_COLOR = "#1e293b"

#: (metrics key, legend label, colour, axis, hover format) of the lines drawn per GRPO step.
POLICY_KEYS = (
    (ENTROPY_KEY, "sampled entropy", "#7c3aed", "right", ".3g"),
    (KL_KEY, "KL from the start", "#dc2626", "right", ".3g"),
    ("grad_norm", "grad norm", "#f59e0b", "right", ".3g"),
    ("reward_std", "reward std", "#0ea5e9", "left", ".3f"),
    ("groups_mixed_success_frac", "mixed-success groups", COLORS["groups_mixed_success_frac"], "left", ".0%"),
)


def policy_figure(metrics: list[dict[str, Any]], evals: list[dict[str, Any]] | None = None, title: str = "Policy",
                  t0: float | None = None) -> Figure:
    """The Policy chart of a run (module docstring); with `t0` (the run's start, epoch seconds) each point's hover
    also says its minutes since the start."""
    minutes = t0 is not None
    grpo = in_phase(metrics, "grpo")
    traces = []
    right_values: list[float] = []
    for key, label, color, axis, fmt in POLICY_KEYS:
        x, y, custom = step_series(grpo, key, t0=t0)
        if axis == "right":  # a log axis: zero (the KL at step 0) has no place on it
            kept = [(xi, yi, ci) for xi, yi, ci in zip(x, y, custom) if yi > 0]
            x, y, custom = [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]
            right_values += y
        if not x:
            continue
        traces.append(scatter(x, y, label + (" (right)" if axis == "right" else ""), mode="lines+markers",
                              customdata=custom, yaxis=axis, marker={"size": 4},
                              hovertemplate=hover_template(fmt, minutes),
                              line={"color": color, "width": 2, "dash": "dot" if axis == "right" else "solid"}))
    validation = [r for r in in_phase(evals or [], "grpo")
                  if isinstance(r, dict) and r.get("split") == VALIDATION_SPLIT and not r.get("error")]
    vx, vy, custom = step_series(validation, "success_rate", t0=t0, extra="n_episodes")
    if vx:
        traces.append(scatter(vx, vy, "validation success", mode="markers", customdata=custom,
                              hovertemplate=hover_template(".0%", minutes, episodes=True),
                              marker={"size": 10, "symbol": "diamond", "color": VALIDATION_COLOR}))
    tickvals, ticktext = log_ticks(right_values)
    right_axis: dict[str, Any] = {"type": "log", "title": {"text": "nats/token · grad norm (log)"}}
    if tickvals:
        right_axis.update(tickmode="array", tickvals=tickvals, ticktext=ticktext)
    return phase_panels_figure([
        # Shares (0 to 1) and the reward std (about as large) share the left axis: from 0, as far as they reach.
        {"phase": "grpo", "traces": traces, "y_title": "share · reward std", "yaxis": {"rangemode": "tozero"},
         "right_axis": right_axis},
    ], title, "no GRPO step logged yet")
