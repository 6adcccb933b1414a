"""Builds the dashboard's Blocks from its four tabs and launches it (host/port from args or Gradio's env)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import gradio as gr
from starlette.middleware import Middleware

from dashboard import compare_tab, play_episodes, play_tab, runs_tab, train_tab
from dashboard.access import FORWARDED_ALLOW_IPS_ENV, AccessPolicy, OwnerGate, trusted_proxies_setting
from dashboard.context import AppContext
from dashboard.http_guard import RequestGuard, body_timeout_s
from dashboard.storage import choose_runs_root
from dashboard.live_plot import plotly_js_path
from dashboard.transcripts import CSS as TRANSCRIPT_CSS

TITLE = "SQLEnv — teach a small model to answer questions about databases"
CSS = TRANSCRIPT_CSS + """
.gradio-container { max-width: 1500px !important; }
#sqe-header h1 { margin-bottom: 0; }
#sqe-header p { margin-top: 2px; color: #64748b; }
#owner-bar { align-items: center; }
"""


# System fonts only: the app must look right offline (no Google Fonts request).
# Gradio paints a hovered primary button and a disabled one with the same "hover" fill, which Soft makes a pale
# indigo: Start under a resting pointer (where it stays after a click, through the whole run) looked disabled, and
# a reload, which drops the hover, "fixed" it. A darker hover fill reads as hover; disabled keeps Gradio's grey-out.
THEME = gr.themes.Soft(
    primary_hue="indigo",
    font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
).set(button_primary_background_fill_hover="*primary_600", button_primary_background_fill_hover_dark="*primary_700")


def build_app(ctx: AppContext | None = None) -> gr.Blocks:
    """The dashboard's Blocks. Who may train is `ctx.access` (dashboard.access): this page's owner bar and
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
        for parts in loads:
            fn, inputs, outputs = parts["load"]
            demo.load(fn, inputs=inputs, outputs=outputs, show_progress="hidden")
        demo.unload(play_parts["unload"])  # a closed page's Play episode is closed at once
        # Opening a tab shows what is on disk now (a run may have finished since the page loaded).
        fn, inputs, outputs = compare_parts["load"]
        compare.select(fn, inputs=inputs, outputs=outputs, show_progress="hidden")
        fn, inputs, outputs = runs_parts["load"]
        runs.select(fn, inputs=inputs, outputs=outputs, show_progress="hidden")
        ctx.owner.wire(demo)  # after every tab registered its owner-only controls
    return demo


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="app.py", description="SQLEnv dashboard")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="interface to listen on (env GRADIO_SERVER_NAME; 0.0.0.0 on a Space)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                        help="port (env GRADIO_SERVER_PORT, default 7860)")
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="runs folder (default $SQLENV_RUNS_DIR; on a Space with persistent storage /data/runs; "
                             "else runs/)")
    parser.add_argument("--config", type=Path, default=None,
                        help="JSON TrainConfig whose values fill the Train form (default configs/tiny_cpu.json)")
    parser.add_argument("--data-dir", type=Path, default=None, help="datasets folder (default $SQLENV_DATA_DIR or data/)")
    return parser.parse_args(argv)


# Gradio's queue loop polls for work every 1 ms when idle (0.001 s sleeps on Linux): on a 2-core machine that
# is ~10% of a core and a thousand GIL grabs a second taken from the training thread in the same process.
# 50 ms between checks adds at most that to a queued click and removes the tax (bench/dashboard_tax.py).
QUEUE_IDLE_SLEEP_S = 0.05


def tune_queue(demo: gr.Blocks) -> None:
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_IDLE_SLEEP_S)
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, 2 * QUEUE_IDLE_SLEEP_S)


# The app takes no files: Gradio refuses uploads larger than this, so visitors cannot fill its temp folder (the
# upload route itself is answered 403 by `dashboard.http_guard.RequestGuard`).
MAX_UPLOAD_BYTES = 1
# Sessions whose state Gradio keeps (its `state_session_capacity`, 10,000 by default): past it the least recently
# used goes. Each holds ~230 KB of page state plus the latest value of every input its events sent, each value
# bounded by `RequestGuard` (`dashboard.http_guard.session_bytes_bound`); a session pushed out loses its Play
# handle (its episode is closed already past SQLENV_PLAY_MAX_EPISODES), and its page starts again at New episode.
SESSIONS_ENV = "SQLENV_APP_SESSIONS"
DEFAULT_SESSIONS_KEPT = 128
# Events waiting in Gradio's queue, each holding its inputs (default: no limit); one more is told the queue is full.
QUEUE_MAX_EVENTS = 256


def sessions_kept(env: dict[str, str] | None = None) -> int:
    """`SQLENV_APP_SESSIONS` (default 128): how many sessions' state the app keeps."""
    text = ((os.environ if env is None else env).get(SESSIONS_ENV) or str(DEFAULT_SESSIONS_KEPT)).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{SESSIONS_ENV} must be a positive integer, got {text!r}")
    return int(text)


# After every queued event Gradio rebuilds a pandas summary of the last GRADIO_ANALYTICS_MAX_EVENTS (10,000)
# events for its monitoring page, which this app does not open: with many visitors playing that was the
# server's largest cost beside training (bench/visitors.py). Keep 100 events and summarize every 1,000.
# Gradio reads these when the queue is made; a value already in the environment wins.
GRADIO_QUEUE_ENV = {"GRADIO_ANALYTICS_MAX_EVENTS": "100", "GRADIO_ANALYTICS_CACHE_FREQUENCY": "1000"}


def launch(demo: gr.Blocks, host: str, port: int, prevent_thread_lock: bool = False):
    for name, value in GRADIO_QUEUE_ENV.items():
        os.environ.setdefault(name, value)
    # uvicorn reads its proxy trust from here when Gradio starts it: none unless the operator set it, so a
    # request's client address is its TCP peer (or what SQLENV_PROXY_HOPS reads), never a loopback peer's header.
    os.environ[FORWARDED_ALLOW_IPS_ENV] = trusted_proxies_setting()
    demo.queue(default_concurrency_limit=4, max_size=QUEUE_MAX_EVENTS)
    tune_queue(demo)
    plotly_js = plotly_js_path()  # the live charts' plotly.js, served from the installed package (offline)
    return demo.launch(
        server_name=host, server_port=port, prevent_thread_lock=prevent_thread_lock, css=CSS,
        theme=THEME, show_error=True, footer_links=[], allowed_paths=[str(plotly_js)] if plotly_js else None,
        max_file_size=MAX_UPLOAD_BYTES, state_session_capacity=sessions_kept(),
        app_kwargs={"middleware": [Middleware(RequestGuard, blocks=demo)]},
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.config is not None and not args.config.is_file():
        print(f"app.py: --config {args.config}: no such file", file=sys.stderr)
        raise SystemExit(2)
    try:
        access = AccessPolicy.from_env(args.host)
        play_episodes.limits_from_env()
        sessions_kept()
        body_timeout_s()
    except ValueError as exc:  # a malformed owner or Play setting (SQLENV_PROXY_HOPS, ...): one line, exit 2
        print(f"app.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"[dashboard] training controls: {access.mode} ({access.reason})", file=sys.stderr)
    ctx = AppContext.create(runs_root=choose_runs_root(args.runs_dir), data_root=args.data_dir,
                            default_config=args.config, access=access,
                            hub_repo=os.environ.get("SQLENV_HUB_REPO") or None)
    demo = build_app(ctx)
    try:
        launch(demo, args.host, args.port)
    except OSError as exc:  # port taken, bad host: one line, exit 2
        print(f"app.py: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
