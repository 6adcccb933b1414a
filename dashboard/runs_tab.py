"""Runs tab: every run under runs/ (dashboard, CLI, accelerate; finished or live), one in detail, several
overlaid. Broken runs (missing or corrupt files) are listed as such; names from the page go through
`resolve_run`, so nothing outside runs/ can be read. The owner can push a finished run to the Hub (dashboard.hub);
that event is owner-only (dashboard.access)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import gradio as gr
import pandas as pd

from dashboard import charts
from dashboard import inputs as checked
from dashboard.context import AppContext
from dashboard.run_data import fmt_duration, progress
from dashboard.transcripts import esc, transcript_html

TABLE_HEADERS = ["run", "status", "model", "dataset", "steps", "final success", "final EX", "started"]


def final_success(row: dict[str, Any], runs_root) -> float | None:
    """The trained model's success in the final comparison, else the last eval (as `python -m training.runs list`)."""
    if "final_success" in row:
        return charts.as_float(row.get("final_success"))
    success = charts.as_float(row.get("eval_success"))
    if success is None and runs_root is not None:
        from training.run_dir import read_jsonl

        try:
            records = read_jsonl(runs_root / row["run_id"] / "comparison.jsonl")
        except OSError:
            records = []
        summary = next((r for r in reversed(records) if isinstance(r, dict) and r.get("kind") == "summary"), None)
        trained = summary.get("trained") if isinstance(summary, dict) else None
        success = charts.as_float(trained.get("success_rate")) if isinstance(trained, dict) else None
    return success


def final_execution(row: dict[str, Any]) -> str:
    """The trained model's execution accuracy in the final comparison, else the last eval ("–" before EX)."""
    ex = charts.as_float(row.get("final_execution"))
    return f"{ex:.0%}" if ex is not None else "–"


def runs_table(rows: list[dict[str, Any]], runs_root=None) -> pd.DataFrame:
    data = []
    for r in rows:
        step, total = r.get("step"), r.get("total_steps")
        steps = f"{step if step is not None else '?'} / {total if total is not None else '?'}"
        success = final_success(r, runs_root)
        started = r.get("started_at")
        if isinstance(started, str):
            started = started.replace("T", " ")[:19]
        elif started is None:
            started = dt.datetime.fromtimestamp(r.get("mtime", 0)).strftime("%Y-%m-%d %H:%M:%S") + " (mtime)"
        data.append([
            r.get("run_id", "?"), r.get("status", "unknown"), str(r.get("model", "?")), str(r.get("dataset", "?")),
            steps, f"{success:.0%}" if success is not None else "–", final_execution(r), started,
        ])
    return pd.DataFrame(data, columns=TABLE_HEADERS)


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
    final = next((e for e in reversed(snap.evals) if isinstance(e, dict) and e.get("split") == "eval"), None)
    success = charts.as_float(final.get("success_rate")) if final else None
    return (
        f'<div class="sqe-card sqe-status" id="runs-detail-status" data-run="{esc(snap.run_id)}" data-status="{esc(state)}">'
        f'<div><b>{esc(snap.run_id)}</b> <span class="sqe-badge sqe-{kind}">{esc(state)}</span></div>'
        f'<div class="sqe-meta">step {p["step"]} / {p["total"] if p["total"] is not None else "?"} · elapsed '
        f'{fmt_duration(p["elapsed"])} · {len(snap.metrics)} metric lines · {len(snap.evals)} evals · '
        f'{len(snap.transcripts)} traces · eval success {f"{success:.0%}" if success is not None else "–"}</div>'
        f"{errs}</div>"
    )


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
    choices = []
    for i, record in enumerate(snap.transcripts):
        if isinstance(record, dict) and isinstance(record.get("transcript"), dict):
            t = record["transcript"]
            choices.append((f"step {record.get('step', '?')} — {t.get('outcome', '?')} — {t.get('question_id', '')}", i))
    return choices[::-1]


def resume_controls(ctx: AppContext, pick: Any) -> None:
    """A Resume button for the picked run: continues a stopped, failed or interrupted run from its last checkpoint
    in the dashboard's training process (the Train tab then shows it). Owner-only: it spends compute and writes."""
    with gr.Row():
        resume_btn = gr.Button("Resume this run", elem_id="runs-resume", scale=0, min_width=160)
        resume_message = gr.HTML("", elem_id="runs-resume-message")

    def resume(name):
        from dashboard.runner import RunnerBusy

        if not name:
            return '<div class="sqe-err-box">Pick a run first.</div>'
        try:
            run_id = ctx.runner.resume(name)
        except (RunnerBusy, ValueError, FileNotFoundError) as exc:  # InvalidRunName is a ValueError
            return f'<div class="sqe-err-box">{esc(str(exc))}</div>'
        return (f'<div class="sqe-ok-box">Resuming <b>{esc(run_id)}</b> from its last checkpoint: follow it in the '
                "Train tab.</div>")

    # Spends compute and writes files: owner-only (dashboard.access), checked on the server for every call.
    ctx.owner.control(resume_btn)
    ctx.owner.owner_event(resume_btn.click, resume, inputs=[pick], outputs=[resume_message], show_progress="hidden",
                          action="resume a run")


def build(ctx: AppContext) -> dict[str, Any]:
    with gr.Row():
        gr.Markdown("Every run under `runs/`, newest first — from this dashboard, the CLI or `accelerate launch`.")
        refresh_btn = gr.Button("Refresh", elem_id="runs-refresh", scale=0, min_width=120)
    table = gr.Dataframe(pd.DataFrame(columns=TABLE_HEADERS), interactive=False, elem_id="runs-table",
                         max_height=320, wrap=True)
    with gr.Row():
        pick = gr.Dropdown([], label="Inspect a run", elem_id="runs-pick", scale=1)
        overlay = gr.Dropdown([], multiselect=True, label="Overlay runs (reward and eval success)",
                              elem_id="runs-overlay", scale=2)
    resume_controls(ctx, pick)
    with gr.Tabs():
        with gr.Tab("Run detail", id="runs-detail"):
            detail = gr.HTML('<div class="sqe-muted">Pick a run above.</div>', elem_id="runs-detail")
            results = gr.Dataframe(pd.DataFrame(columns=["hardness"]), interactive=False, wrap=True,
                                   label="Results by hardness (success and EX: rate [95% CI] (episodes))",
                                   elem_id="runs-results")
            with gr.Row():
                reward_plot = gr.Plot(charts.plot_data(charts.reward_figure([])), show_label=False, elem_id="runs-chart-reward")
                success_plot = gr.Plot(charts.plot_data(charts.success_figure([])), show_label=False, elem_id="runs-chart-success")
            health_plot = gr.Plot(charts.plot_data(charts.tool_health_figure([])), show_label=False, elem_id="runs-chart-health")
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
        return runs_table(rows, ctx.runs.runs_root), gr.update(choices=names, value=value), gr.update(choices=names, value=keep)

    def show(name):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None:
            empty = f'<div class="sqe-muted">{esc(err or "")}</div>'
            return (empty, results_frame(None), charts.plot_data(charts.reward_figure([])), charts.plot_data(charts.success_figure([])), charts.plot_data(charts.tool_health_figure([])), "",
                    gr.update(choices=[], value=None), "")
        choices = transcript_choices(snap)
        first = choices[0][1] if choices else None
        return (
            detail_header(snap),
            results_frame(snap),
            charts.plot_data(charts.reward_figure(snap.metrics, t0=snap.t0)),
            charts.plot_data(charts.success_figure(snap.evals, snap.metrics, t0=snap.t0)),
            charts.plot_data(charts.tool_health_figure(snap.metrics, t0=snap.t0)),
            json.dumps(snap.config, indent=2, default=str) if snap.config is not None else f"// {snap.config_error}",
            gr.update(choices=choices, value=first),
            show_trace(name, first),
        )

    def show_trace(name, index):
        snap, err = ctx.runs.try_snapshot(name)
        if snap is None or index is None:
            return '<div class="sqe-muted">No transcript in this run.</div>'
        try:
            record = snap.transcripts[int(index)]
        except (ValueError, IndexError, TypeError):
            return '<div class="sqe-muted">Transcript not found.</div>'
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

    detail_outputs = [detail, results, reward_plot, success_plot, health_plot, config, trace_pick, trace]
    refresh_btn.click(refresh, inputs=[pick, overlay], outputs=[table, pick, overlay]).then(
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
    return {"load": (refresh, [pick, overlay], [table, pick, overlay]), "refresh": refresh_btn}
