"""Train tab: the config form (`dashboard.train.form`) beside the live status, charts and latest trace
(`dashboard.train.live`, its status bar from `dashboard.train.status`); this module lays them out and wires Start,
Stop and the long poll to the runner.

The page holds no training state: every poll asks the runner which run is current and reads that run's
directory, so a reload or a second browser shows the same live run.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from dashboard.core.context import AppContext
from dashboard.core.runner import ConfigInvalid, RunnerBusy, build_config
from dashboard.train.form import build_form, form_message
from dashboard.train.live import LiveUpdates, build_live_view

__all__ = ["build"]


def build(ctx: AppContext) -> dict[str, Any]:
    """The tab's content; returns `{"load": (fn, inputs, outputs)}`, what the app runs when a page loads."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=330):
            form = build_form(ctx)
        with gr.Column(scale=3):
            view = build_live_view()
    seen = gr.State(None)  # per session: (run id, file signature) last sent to this page
    timer = gr.Timer(ctx.poll_seconds)
    live = LiveUpdates(ctx)
    refresh = live.refresh
    outputs = [*view.components, seen]

    def start(*args):
        *values, last_seen = args
        try:
            config = build_config(form.config_values(ctx, values))
        except ConfigInvalid as exc:
            label = form.label(exc.field)
            where = f"<b>{html.escape(str(label))}</b> (<code>{html.escape(exc.field)}</code>): " if exc.field else ""
            return (form_message("error", f"Invalid config — {where}{html.escape(str(exc))}"), *refresh(None),
                    *form.marks(exc.field))
        except Exception as exc:  # training package missing or broken
            return (form_message("error", f"Cannot build the config: {html.escape(str(exc))}"), *refresh(None),
                    *form.marks())
        try:
            run_id = ctx.runner.start(config)
        except RunnerBusy as exc:
            return (form_message("error", html.escape(str(exc))), *refresh(last_seen), *form.marks())
        return (form_message("ok", f"Started <b>{html.escape(run_id)}</b>."), *refresh(None), *form.marks())

    def stop(last_seen):
        return (form_message("ok", html.escape(ctx.runner.stop())), *refresh(last_seen))

    # Owner-only (dashboard.access.owner): the server checks the caller on every call; visitors see them greyed out.
    owner = ctx.owner
    owner.control(form.start_btn, form.stop_btn, *form.inputs, *form.advanced)
    owner.owner_event(form.start_btn.click, start, inputs=[*form.inputs, *form.advanced, seen],
                      outputs=[form.message, *outputs, *form.inputs], show_progress="hidden", action="start training")
    owner.owner_event(form.stop_btn.click, stop, inputs=[seen], outputs=[form.message, *outputs],
                      show_progress="hidden", action="stop training")
    # Ticks while a poll is still waiting are skipped (trigger mode "once"), so a page holds one poll at a time.
    timer.tick(live.poll, inputs=[seen], outputs=None, show_progress="hidden", queue=False).then(
        refresh, inputs=[seen], outputs=outputs, show_progress="hidden", queue=False)
    form.wire_fill(ctx)
    return {"load": (refresh, [seen], outputs)}
