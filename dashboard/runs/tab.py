"""Runs tab: every run under runs/ (dashboard, CLI, accelerate; finished or live) in a table (`dashboard.runs.table`),
one in detail (`dashboard.runs.detail`), two runs' configs compared field by field (`dashboard.runs.config_diff`),
several overlaid. Each success shown says what it measured (`training.run.results.Measured`). Broken runs (missing or
corrupt files) are listed as such; names from the page go through `resolve_run`, so nothing outside runs/ can be
read. The owner can resume a stopped, failed or interrupted run (`dashboard.runs.resume`), and push a finished run to
the Hub (`dashboard.runs.hub`); those events are owner-only (`dashboard.access.owner`). This module lays the tab out
and wires it."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd

from dashboard.access import inputs as checked
from dashboard.core import charts, picks
from dashboard.core.context import AppContext
from dashboard.core.policy_chart import policy_figure
from dashboard.core.transcripts import esc, transcript_html
from dashboard.runs.config_diff import config_diff_controls
from dashboard.runs.detail import detail_header, results_frame, transcript_choices
from dashboard.runs.hub import HubPushError, push_run
from dashboard.runs.resume import resumable, resume_controls
from dashboard.runs.table import TABLE_HEADERS, TABLE_WIDTHS, runs_table

__all__ = ["build"]


def build(ctx: AppContext) -> dict[str, Any]:
    with gr.Row():
        gr.Markdown("Every run under `runs/`, newest first — from this dashboard, the CLI or `accelerate launch`.")
        refresh_btn = gr.Button("Refresh", elem_id="runs-refresh", scale=0, min_width=120)
    # Widths set: Gradio sizes a column by its longest cell unwrapped, so "measured on" pushed "started" off the
    # table; with a width, that cell wraps instead.
    table = gr.Dataframe(pd.DataFrame(columns=TABLE_HEADERS), interactive=False, elem_id="runs-table",
                         max_height=320, wrap=True, column_widths=TABLE_WIDTHS)
    with gr.Row():
        pick = gr.Dropdown([], label="Inspect a run", elem_id="runs-pick", scale=1)
        overlay = gr.Dropdown([], multiselect=True, label="Overlay runs (reward and eval success)",
                              elem_id="runs-overlay", scale=2)
    resume_btn, resume_message = resume_controls(ctx, pick)
    with gr.Tabs():
        with gr.Tab("Run detail", id="runs-detail"):
            detail = gr.HTML('<div class="sqe-muted">Pick a run above.</div>', elem_id="runs-detail")
            results = gr.Dataframe(pd.DataFrame(columns=["hardness"]), interactive=False, wrap=True,
                                   label="Results by hardness (success and EX: rate [95% CI] (episodes))",
                                   elem_id="runs-results")
            with gr.Row():
                reward_plot = gr.Plot(charts.plot_data(charts.reward_figure([])), show_label=False, elem_id="runs-chart-reward")
                success_plot = gr.Plot(charts.plot_data(charts.success_figure([])), show_label=False, elem_id="runs-chart-success")
            with gr.Row():
                health_plot = gr.Plot(charts.plot_data(charts.tool_health_figure([])), show_label=False,
                                      elem_id="runs-chart-health")
                policy_plot = gr.Plot(charts.plot_data(policy_figure([])), show_label=False,
                                      elem_id="runs-chart-policy")
            with gr.Row(equal_height=False):
                with gr.Column(scale=1, min_width=260):
                    config = gr.Code("", language="json", label="config.json", elem_id="runs-config",
                                     max_lines=30, interactive=False)
                with gr.Column(scale=3):
                    trace_pick = gr.Dropdown([], label="Transcript", elem_id="runs-trace-pick")
                    trace = gr.HTML("", elem_id="runs-trace")
            with gr.Accordion("Push this run to the Hugging Face Hub (owner only)", open=False, elem_id="runs-push"):
                gr.Markdown(
                    "Uploads the run's files and its `final/` weights into `runs/<run id>/` of a model repo "
                    "(created private when missing), with the server's `HF_TOKEN`: the run then survives a "
                    "restart of the machine it was trained on."
                )
                with gr.Row(equal_height=True):
                    hub_repo = gr.Textbox(ctx.hub_repo or "", label="Hub repo", placeholder="your-name/sqlenv-runs",
                                          elem_id="runs-push-repo", max_length=checked.MAX_NAME_CHARS, scale=3)
                    push_btn = gr.Button("Push to the Hub", elem_id="runs-push-button", scale=1)
                push_message = gr.HTML("", elem_id="runs-push-message")
        with gr.Tab("Config diff", id="runs-diff-tab"):
            diff_a, diff_b = config_diff_controls(ctx)
        with gr.Tab("Overlay", id="runs-overlay-tab"):
            with gr.Row():
                overlay_reward = gr.Plot(charts.plot_data(charts.reward_overlay({})), show_label=False, elem_id="runs-overlay-reward")
                overlay_success = gr.Plot(charts.plot_data(charts.success_overlay({})), show_label=False, elem_id="runs-overlay-success")

    pick_listing, overlay_listing = picks.listing_holder(), picks.listing_holder()

    def refresh(current, current_overlay):
        # The picks are set in the page when this answer arrives (`picks.keep_picks`): the inputs may be stale.
        rows = ctx.runs.list()
        names = [r["run_id"] for r in rows]
        healthy = [r["run_id"] for r in rows if r.get("status") not in ("missing", "corrupt")]
        # The config diff's pickers get the same list (their picks stay: this public endpoint keeps its two inputs).
        listed = gr.update(choices=names)
        return (runs_table(rows, ctx.runs), listed, listed, listed, listed,
                picks.listing(names, next(iter(healthy or names), None)), picks.listing(names))

    def show(name):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            empty = f'<div class="sqe-muted">{esc(err or "")}</div>'
            return (empty, results_frame(None), charts.plot_data(charts.reward_figure([])),
                    charts.plot_data(charts.success_figure([])), charts.plot_data(charts.tool_health_figure([])),
                    charts.plot_data(policy_figure([])), "",
                    gr.update(choices=[], value=None), "", gr.update(visible=False), "")
        choices = transcript_choices(snap)
        first = choices[0][1] if choices else None
        return (
            detail_header(snap),
            results_frame(snap),
            charts.plot_data(charts.reward_figure(snap.metrics, t0=snap.t0)),
            charts.plot_data(charts.success_figure(snap.evals, snap.metrics, t0=snap.t0)),
            charts.plot_data(charts.tool_health_figure(snap.metrics, t0=snap.t0)),
            charts.plot_data(policy_figure(snap.metrics, snap.evals, t0=snap.t0)),
            json.dumps(snap.config, indent=2, default=str) if snap.config is not None else f"// {snap.config_error}",
            gr.update(choices=choices, value=first),
            show_trace(name, first),
            gr.update(visible=resumable(snap)),  # a completed run offers no Resume
            "",
        )

    def show_trace(name, index):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None or index is None:
            return '<div class="sqe-muted">No transcript in this run.</div>'
        record = snap.transcript(index)  # the picker's value: the byte offset of a line the snapshot lists
        if record is None:
            return '<div class="sqe-muted">Transcript not found (the run may have changed: pick it again).</div>'
        return transcript_html(record.get("transcript"), title=f"Trace at step {record.get('step', '?')}")

    def show_overlay(names):
        metrics, evals = {}, {}
        try:
            names = checked.run_names(names)
        except checked.InputRefused as exc:
            gr.Warning(str(exc))
            names = []
        for name in names:
            snap, _ = ctx.runs.try_snapshot(name)
            if snap is not None:
                metrics[snap.run_id], evals[snap.run_id] = snap.metrics, snap.evals
        return charts.plot_data(charts.reward_overlay(metrics)), charts.plot_data(charts.success_overlay(evals))

    detail_outputs = [detail, results, reward_plot, success_plot, health_plot, policy_plot, config, trace_pick, trace,
                      resume_btn, resume_message]
    list_inputs = [pick, overlay]
    list_outputs = [table, pick, overlay, diff_a, diff_b, pick_listing, overlay_listing]
    picked = [(pick, pick_listing), (overlay, overlay_listing)]
    picks.keep_picks(refresh_btn.click(refresh, inputs=list_inputs, outputs=list_outputs), picked).then(
        show, inputs=[pick], outputs=detail_outputs
    )
    pick.change(show, inputs=[pick], outputs=detail_outputs)
    trace_pick.input(show_trace, inputs=[pick, trace_pick], outputs=[trace])
    overlay.change(show_overlay, inputs=[overlay], outputs=[overlay_reward, overlay_success])

    def select_row(evt: gr.SelectData, rows):
        try:
            return gr.update(value=str(rows.iloc[evt.index[0], 0]))
        except Exception:
            return gr.skip()

    table.select(select_row, inputs=[table], outputs=[pick])

    def push(name, repo):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            return f'<div class="sqe-err-box">{esc(err)}</div>'
        try:
            url = push_run(ctx.runs.resolve(snap.run_id), checked.name(repo, "Hub repo"))
        except (HubPushError, checked.InputRefused) as exc:
            return f'<div class="sqe-err-box">{esc(exc)}</div>'
        return f'<div class="sqe-ok-box">Pushed <b>{esc(snap.run_id)}</b>: <a href="{esc(url)}">{esc(url)}</a></div>'

    ctx.owner.control(hub_repo, push_btn)
    ctx.owner.owner_event(push_btn.click, push, inputs=[pick, hub_repo], outputs=[push_message],
                          action="push runs to the Hub")
    return {"load": (refresh, list_inputs, list_outputs), "then": lambda e: picks.keep_picks(e, picked),
            "refresh": refresh_btn}
