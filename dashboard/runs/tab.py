"""Runs tab: every run under runs/ (dashboard, CLI, accelerate; finished or live), one in detail, two runs' configs
compared field by field (`dashboard.config_diff`), several overlaid. Each success shown says what it measured
(`training.run.results.Measured`). Broken runs (missing or corrupt files) are listed as such; names from the page go through
`resolve_run`, so nothing outside runs/ can be read. The owner can resume a stopped, failed or interrupted run, and
push a finished run to the Hub (dashboard.hub); those events are owner-only (dashboard.access)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from dashboard import charts
from dashboard import inputs as checked
from dashboard.context import AppContext
from dashboard.policy_chart import policy_figure
from dashboard.run_data import RunCache, fmt_duration, progress
from dashboard.run_notes import kept_html
from dashboard.transcripts import esc, transcript_html
from training.run.results import fmt_rate

# "success" and "EX" are one measurement, and "measured on" says which (`training.run.results.Measured`): the final comparison's
# trained model, else the last periodic eval; the run detail says it in the same words.
TABLE_HEADERS = ["run", "status", "model", "dataset", "steps", "success", "EX", "measured on", "started"]
TABLE_WIDTHS = ["auto"] * 7 + ["260px", "auto"]  # "measured on" wraps in a fixed width; the rest fit their cells


def runs_table(rows: list[dict[str, Any]], runs: RunCache | Path | None = None) -> pd.DataFrame:
    """The Runs table: one row per listed run (`RunCache.list`), its headline result read through `runs` (a cache,
    or the runs folder)."""
    if runs is not None and not isinstance(runs, RunCache):
        runs = RunCache(Path(runs))
    data = []
    for r in rows:
        step, total = r.get("step"), r.get("total_steps")
        steps = f"{step if step is not None else '?'} / {total if total is not None else '?'}"
        measured = None
        if runs is not None:
            try:
                measured, _ = runs.measures(r["run_id"])
            except (ValueError, OSError):  # gone or renamed since it was listed
                measured = None
        started = r.get("started_at")
        if isinstance(started, str):
            started = started.replace("T", " ")[:19]
        elif started is None:
            started = dt.datetime.fromtimestamp(r.get("mtime", 0)).strftime("%Y-%m-%d %H:%M:%S") + " (mtime)"
        data.append([
            r.get("run_id", "?"), r.get("status", "unknown"), str(r.get("model", "?")), str(r.get("dataset", "?")),
            steps, fmt_rate(measured.success if measured else None), fmt_rate(measured.execution if measured else None),
            measured.label if measured else "not measured yet", started,
        ])
    return pd.DataFrame(data, columns=TABLE_HEADERS)


def success_html(snap) -> str:
    """The run's headline result and, when that is the final comparison, its last periodic eval too: each with
    what it measured, in the Runs table's words."""
    from training.run.results import comparison_measure, last_eval_measure

    split = str((snap.config or {}).get("eval_split") or "eval")
    lines = []
    for kind, measured in (("final", comparison_measure(snap.summary, split)),
                           ("eval", last_eval_measure(snap.evals, split))):
        if measured is not None:
            lines.append(f'<div data-measure="{kind}"><b>{esc(measured.rates())}</b> — {esc(measured.label)}</div>')
    if not lines:
        lines.append('<div data-measure="none">success not measured yet (no eval or comparison)</div>')
    return f'<div class="sqe-meta" id="runs-detail-success">{"".join(lines)}</div>'


def detail_header(snap) -> str:
    status = snap.status
    p = progress(status)
    state = snap.state
    kind = {"running": "ok", "completed": "ok", "queued": "warn", "stopped": "warn"}.get(state, "bad")
    problems = []
    if status.get("error"):
        problems.append(str(status["error"]))
    if snap.config_error:
        problems.append(snap.config_error)
    errs = "".join(f'<div class="sqe-err-box">{esc(p_)}</div>' for p_ in problems)
    return (
        f'<div class="sqe-card sqe-status" id="runs-detail-status" data-run="{esc(snap.run_id)}" data-status="{esc(state)}">'
        f'<div><b>{esc(snap.run_id)}</b> <span class="sqe-badge sqe-{kind}">{esc(state)}</span></div>'
        f'<div class="sqe-meta">step {p["step"]} / {p["total"] if p["total"] is not None else "?"} · elapsed '
        f'{fmt_duration(p["elapsed"])} · {lines_text(snap)}</div>{success_html(snap)}'
        f'{kept_html(snap, "runs-detail-kept")}{errs}</div>'
    )


def lines_text(snap) -> str:
    """How many metric lines, evals and traces the run wrote ("~" where counted from a sample), and, when its
    charts draw fewer points than it logged, that they draw a spread of them."""
    parts, charted = [], ""
    for kind, label, kept in (("metrics", "metric lines", snap.metrics), ("evals", "evals", snap.evals),
                              ("transcripts", "traces", snap.transcripts)):
        lines, exact = snap.line_counts.get(kind, (len(kept), True))
        parts.append(f"{'' if exact else '~'}{lines:,} {label}")
        if kind == "metrics" and lines > len(kept):
            charted = f" (charts: {len(kept):,} of them, spread over the run, and the newest)"
    return " · ".join(parts) + charted


def results_frame(snap) -> pd.DataFrame:
    """The run's results by hardness: its final comparison (random / base / trained), else the last eval on each
    split as it recorded its breakdown (runs from before breakdowns: the overall success alone)."""
    from dashboard.compare_columns import breakdown_frame, run_columns

    if snap is None:
        return pd.DataFrame(columns=["hardness"])
    columns = run_columns(snap)
    if columns:
        return breakdown_frame(columns, "hardness")
    last: dict[str, dict] = {}
    for record in snap.evals:
        if isinstance(record, dict) and record.get("split"):
            last[str(record["split"])] = record
    if not last:
        return pd.DataFrame(columns=["hardness"])
    headers = ["hardness"] + [f"{split} (step {r.get('step', '?')}) {what}" for split, r in last.items()
                              for what in ("success", "EX")]
    keys = ["all"]
    for record in last.values():
        keys += [k for k in ((record.get("breakdown") or {}).get("hardness") or {}) if k not in keys]
    rows = []
    for key in keys:
        row = [key]
        for record in last.values():
            cells = record.get("breakdown") or {}
            cell = cells.get("overall") if key == "all" else (cells.get("hardness") or {}).get(key)
            if cell is None and key == "all":  # an eval line written before breakdowns
                success = charts.as_float(record.get("success_rate"))
                row += [f"{success:.0%} ({record.get('n_episodes', '?')})" if success is not None else "–", "–"]
                continue
            if not isinstance(cell, dict):
                row += ["–", "–"]
                continue
            row.append(_rate_text(cell.get("success_rate"), cell.get("success_ci"), cell.get("n")))
            row.append(_rate_text(cell.get("execution_accuracy"), cell.get("execution_ci"), cell.get("n_execution")))
        rows.append(row)
    return pd.DataFrame(rows, columns=headers)


def _rate_text(rate: Any, ci: Any, n: Any) -> str:
    rate = charts.as_float(rate)
    if rate is None:
        return "–"
    interval = f" [{ci[0]:.0%}–{ci[1]:.0%}]" if isinstance(ci, list) and len(ci) == 2 else ""
    return f"{rate:.0%}{interval} ({n})"


def transcript_choices(snap) -> list:
    """The picker's (label, byte offset of its line) of the traces the snapshot lists, newest first."""
    choices = []
    for summary in snap.transcripts:
        if summary.get("has_transcript"):
            step = summary["step"] if summary.get("step") is not None else "?"
            choices.append((f"step {step} — {summary['outcome'] or '?'} — {summary['question_id']}",
                            summary["offset"]))
    return choices[::-1]


def resumable(snap) -> bool:
    """Whether `python -m training.train --resume` (and the runner) would take the run: stopped, failed or
    interrupted (`training.run.directory.RESUMABLE_STATUSES`), with its config.json to resume from."""
    from training.run.directory import RESUMABLE_STATUSES

    return snap is not None and snap.state in RESUMABLE_STATUSES and snap.config is not None


def resume_controls(ctx: AppContext, pick: Any) -> tuple[Any, Any]:
    """A Resume button for the picked run: continues a stopped, failed or interrupted run from its last checkpoint
    in the dashboard's training process (the Train tab then shows it). Shown only while the picked run is resumable
    (`resumable`: a completed run has nothing to resume); the runner refuses the others anyway. Owner-only: it
    spends compute and writes. Returns (button, message) for the run picker to update."""
    with gr.Row():
        resume_btn = gr.Button("Resume this run", elem_id="runs-resume", scale=0, min_width=200, visible=False)
        resume_message = gr.HTML("", elem_id="runs-resume-message")

    def resume(name):
        from dashboard.runner import RunnerBusy

        if not name:
            return '<div class="sqe-err-box">Pick a run first.</div>', gr.skip()
        try:
            run_id = ctx.runner.resume(name)
        except (RunnerBusy, ValueError, FileNotFoundError) as exc:  # InvalidRunName is a ValueError
            return f'<div class="sqe-err-box">{esc(str(exc))}</div>', gr.skip()
        # The run is training again, so no longer resumable: the button goes until a run picked is.
        return (f'<div class="sqe-ok-box">Resuming <b>{esc(run_id)}</b> from its last checkpoint: follow it in the '
                "Train tab.</div>", gr.update(visible=False))

    # Spends compute and writes files: owner-only (dashboard.access), checked on the server for every call.
    ctx.owner.control(resume_btn)
    ctx.owner.owner_event(resume_btn.click, resume, inputs=[pick], outputs=[resume_message, resume_btn],
                          show_progress="hidden", action="resume a run")
    return resume_btn, resume_message


DIFF_EMPTY_HEADERS = ["field", "run A", "run B"]


def config_diff_view(runs: RunCache, name_a: Any, name_b: Any) -> tuple[str, pd.DataFrame]:
    """(message HTML, table) of the config fields that differ between two listed runs. A public event: names from
    the page must be runs the app lists (never a path; `RunCache.list` then `try_snapshot`'s `resolve_run`), and
    configs come from the cache, secret-named values already redacted."""
    from dashboard.config_diff import IDENTITY_KEYS, diff_configs, diff_table, flatten

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

    def refresh(current, current_overlay):
        rows = ctx.runs.list()
        names = [r["run_id"] for r in rows]
        healthy = [r["run_id"] for r in rows if r.get("status") not in ("missing", "corrupt")]
        value = current if current in names else next(iter(healthy or names), None)
        keep = [n for n in (current_overlay or []) if n in names]
        # The config diff's pickers get the same list (their picks stay: this public endpoint keeps its two inputs).
        diff_pick = gr.update(choices=names)
        return (runs_table(rows, ctx.runs), gr.update(choices=names, value=value), gr.update(choices=names, value=keep),
                diff_pick, diff_pick)

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
    list_inputs, list_outputs = [pick, overlay], [table, pick, overlay, diff_a, diff_b]
    refresh_btn.click(refresh, inputs=list_inputs, outputs=list_outputs).then(
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
        from dashboard.hub import HubPushError, push_run

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
    return {"load": (refresh, list_inputs, list_outputs), "refresh": refresh_btn}
