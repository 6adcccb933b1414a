"""The dashboard's page: its header, the owner bar and the four tabs (Train, Compare, Play, Runs), each built by its
own folder; what every tab runs when a page loads. `dashboard.server` serves it.
"""

from __future__ import annotations

import dataclasses

import gradio as gr

from dashboard.access.owner import OwnerGate
from dashboard.compare import tab as compare_tab
from dashboard.core.context import AppContext
from dashboard.play import tab as play_tab
from dashboard.runs import tab as runs_tab
from dashboard.train import tab as train_tab

__all__ = ["TITLE", "build_app"]

TITLE = "SQLEnv — teach a small model to answer questions about databases"


def build_app(ctx: AppContext | None = None) -> gr.Blocks:
    """The dashboard's Blocks. Who may train is `ctx.access` (dashboard.access.owner): this page's owner bar and
    owner-only events come from a fresh `OwnerGate` over it."""
    ctx = dataclasses.replace(ctx or AppContext.create())
    ctx.owner = OwnerGate(ctx.access)
    with gr.Blocks(title="SQLEnv dashboard") as demo:
        gr.Markdown(
            f"# SQLEnv\nGRPO on a sandboxed SQL-exploration environment: an agent DESCRIBEs, SAMPLEs and QUERYs "
            f"a SQLite database, then ANSWERs. Runs are saved under `{ctx.runs.runs_root}/`.",
            elem_id="sqe-header",
        )
        ctx.owner.render()
        loads = []
        with gr.Tabs(elem_id="sqe-tabs"):
            with gr.Tab("Train", id="train"):
                loads.append(train_tab.build(ctx))
            with gr.Tab("Compare", id="compare") as compare:
                compare_parts = compare_tab.build(ctx)
                loads.append(compare_parts)
            with gr.Tab("Play", id="play"):
                play_parts = play_tab.build(ctx)
                loads.append(play_parts)
            with gr.Tab("Runs", id="runs") as runs:
                runs_parts = runs_tab.build(ctx)
                loads.append(runs_parts)
        # A tab's "load" is (fn, inputs, outputs); its optional "then" chains what runs in the page after the answer
        # (the run pickers' `dashboard.core.picks.keep_picks`).
        def on(trigger, parts):
            fn, inputs, outputs = parts["load"]
            parts.get("then", lambda event: event)(trigger(fn, inputs=inputs, outputs=outputs, show_progress="hidden"))

        for parts in loads:
            on(demo.load, parts)
        demo.unload(play_parts["unload"])  # a closed page's Play episode is closed at once
        # Opening a tab shows what is on disk now (a run may have finished since the page loaded).
        on(compare.select, compare_parts)
        on(runs.select, runs_parts)
        ctx.owner.wire(demo)  # after every tab registered its owner-only controls
    return demo
