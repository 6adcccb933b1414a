"""The Train tab's live side: the status bar, the four charts and the latest trace of the current run, kept up to
date by a long poll per page (`LiveUpdates.poll`, then `LiveUpdates.refresh`) that sends only what changed.

The page holds no training state: every poll asks the runner which run is current and reads that run's directory,
so a reload or a second browser shows the same live run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gradio as gr

from dashboard.core import charts
from dashboard.core.context import AppContext
from dashboard.core.policy_chart import policy_figure
from dashboard.core.run_data import RunSnapshot
from dashboard.core.transcripts import transcript_html
from dashboard.train.live_plot import LivePlot, live_value
from dashboard.train.status import status_html

__all__ = ["LiveView", "LiveUpdates", "build_live_view", "FILE_CHECK_S", "MIN_UPDATE_S"]

# While a page long-polls, how often it also re-checks the run's files (news normally comes from the runner).
FILE_CHECK_S = 0.5
# The least time between two updates of one page while a run trains fast (see poll).
MIN_UPDATE_S = 1.2
# Send nothing (a poll then costs the browser no work): one skip per live component and the key.
_NOTHING = (gr.skip(),) * 7


@dataclass
class LiveView:
    """The live components (`build_live_view`): the status bar (`#train-status-box`), the reward, success, tool
    health and policy charts (`#chart-reward`, `#chart-success`, `#chart-health`, `#chart-policy`) and the latest
    trace (`#train-trace`), in the order `LiveUpdates.refresh` sends them."""

    status: Any
    reward_plot: Any
    success_plot: Any
    health_plot: Any
    policy_plot: Any
    trace: Any

    @property
    def components(self) -> list[Any]:
        return [self.status, self.reward_plot, self.success_plot, self.health_plot, self.policy_plot, self.trace]


def build_live_view() -> LiveView:
    """The live column's content, empty until a run starts."""
    status = gr.HTML(status_html(None, None), elem_id="train-status-box")
    with gr.Row():
        reward_plot = LivePlot(charts.reward_figure([]), elem_id="chart-reward")
        success_plot = LivePlot(charts.success_figure([]), elem_id="chart-success")
    with gr.Row():
        health_plot = LivePlot(charts.tool_health_figure([]), elem_id="chart-health")
        policy_plot = LivePlot(policy_figure([]), elem_id="chart-policy")
    gr.Markdown("### Latest trace")
    trace = gr.HTML('<div class="sqe-muted">No trace yet.</div>', elem_id="train-trace")
    return LiveView(status, reward_plot, success_plot, health_plot, policy_plot, trace)


class LiveUpdates:
    """What each page is sent: `refresh` answers with a `LiveView`'s new values and the page's new key (what it
    was sent, kept in a per-session `gr.State`); `poll` waits for news first."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def refresh(self, last_seen, probe: bool = False):
        """What this page lacks, given `last_seen` (the key of what it was last sent).

        With `probe` True it only says whether the page has news (a run started or gone, a record written, the
        status changing; the status bar's clock does not count) and builds nothing: the long poll asks this
        every FILE_CHECK_S, and the refresh chained after it builds the update once."""
        runner = self.ctx.runner
        run_id = runner.current_run_id
        if run_id is None:
            # Nothing started in this process (the Runs tab shows older runs).
            if last_seen == "none":
                return False if probe else _NOTHING
            return True if probe else (status_html(None, None), *(gr.skip(),) * 5, "none")
        snap, err = self.ctx.runs.try_snapshot(run_id)
        if snap is None and runner.is_running and runner.active_run_id == run_id:
            # Started a moment ago: training has not written its directory yet.
            snap = RunSnapshot(run_id, {"status": "queued", "phase": "starting"}, None, None)
        if snap is None:
            return True if probe else (status_html(None, err), *(gr.skip(),) * 5, None)
        # Send only what changed since this page's last poll (per file: metrics, evals, transcripts): every
        # chart sent is redrawn by the browser, on the same cores as the training.
        sig = snap.signature
        key = {"run": snap.run_id, "status": sig[0:2], "metrics": sig[2:3], "evals": sig[3:4],
               "transcripts": sig[4:5]}
        old = last_seen if isinstance(last_seen, dict) and last_seen.get("run") == snap.run_id else {}

        def changed(part: str) -> bool:
            return old.get(part) != key[part]

        same_data = not any(changed(part) for part in key)
        if probe:
            return not same_data
        bar = status_html(snap, None, runner.last_error)
        key["bar"] = bar
        if same_data and not changed("bar"):
            return _NOTHING
        metrics_changed = changed("metrics")
        trace_value = gr.skip()
        if changed("transcripts"):
            latest = snap.latest_transcript
            record = snap.transcript(latest["offset"]) if latest else None
            trace_value = (
                transcript_html(record.get("transcript"), title=f"Trace at step {record.get('step', '?')}")
                if record else '<div class="sqe-muted">No trace yet (one is played every trace_every steps).</div>'
            )
        return (
            bar if changed("bar") else gr.skip(),
            live_value(charts.reward_figure(snap.metrics, t0=snap.t0)) if metrics_changed else gr.skip(),
            # Greedy eval success only: the rollouts' sampled correctness is already live in the reward chart
            # (its correctness component), and leaving it out redraws this chart per eval, not per step.
            live_value(charts.success_figure(snap.evals, t0=snap.t0)) if changed("evals") else gr.skip(),
            live_value(charts.tool_health_figure(snap.metrics, t0=snap.t0)) if metrics_changed else gr.skip(),
            # Per step, and per validation eval (its markers).
            live_value(policy_figure(snap.metrics, snap.evals, t0=snap.t0))
            if metrics_changed or changed("evals") else gr.skip(),
            trace_value,
            {**key, "sent_at": time.monotonic()},
        )

    def poll(self, last_seen) -> None:
        """A long poll: return as soon as the run has news (the runner wakes us when training writes a
        record; the run's files are also checked every FILE_CHECK_S), else after `self.ctx.long_poll_seconds`
        (the status bar's clock). It has no outputs: a pending event's outputs each run a per-frame timer in
        the browser's status tracker, so the waiting event must have none. The short `refresh` chained after
        it sends the update. A page watching a run then costs the browser one update per logged step (one
        every few seconds when idle) instead of one per tick."""
        deadline = time.monotonic() + self.ctx.long_poll_seconds
        while True:
            count = self.ctx.runner.news_count
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.refresh(last_seen, probe=True):
                # Several steps a second would each redraw every chart: send at most one update per
                # MIN_UPDATE_S (news waits at most that long, keeping "logged -> plotted" under 2 s).
                sent_at = last_seen.get("sent_at", 0.0) if isinstance(last_seen, dict) else 0.0
                time.sleep(max(0.0, min(sent_at + MIN_UPDATE_S - time.monotonic(), MIN_UPDATE_S)))
                return
            self.ctx.runner.wait_for_news(count, min(left, FILE_CHECK_S))
