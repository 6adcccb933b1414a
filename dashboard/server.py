"""Serves the dashboard's page (`dashboard.page.build_app`): `main` reads the command line and the environment and
launches it; `launch` serves it with uvicorn, request heads and bodies under a deadline and connections bounded.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import threading
import time
from pathlib import Path

import gradio as gr
import uvicorn
from fastapi import FastAPI
from starlette.middleware import Middleware

from dashboard.access.http_guard import RequestGuard, body_timeout_s
from dashboard.access.owner import AccessPolicy, trusted_proxies_setting
from dashboard.core.context import AppContext
from dashboard.core.storage import choose_runs_root
from dashboard.page import build_app
from dashboard.play.episodes import limits_from_env
from dashboard.style import CSS, THEME
from dashboard.train.live_plot import plotly_js_path
from sqlenv.client_address import address_source
from sqlenv.http_connections import ConnectionLimits, http_protocol

__all__ = ["launch", "main", "parse_args", "connection_limits", "sessions_kept"]


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
# 50 ms between checks adds at most that to a queued click and removes the tax (bench/serving/dashboard_tax.py).
QUEUE_IDLE_SLEEP_S = 0.05


def tune_queue(demo: gr.Blocks) -> None:
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_IDLE_SLEEP_S)
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, 2 * QUEUE_IDLE_SLEEP_S)


# The app takes no files: Gradio refuses uploads larger than this, so visitors cannot fill its temp folder (the
# upload route itself is answered 403 by `dashboard.access.http_guard.RequestGuard`).
MAX_UPLOAD_BYTES = 1
# Sessions whose state Gradio keeps (its `state_session_capacity`, 10,000 by default): past it the least recently
# used goes. Each holds ~230 KB of page state plus the latest value of every input its events sent, each value
# bounded by `RequestGuard` (`dashboard.access.http_guard.session_bytes_bound`); a session pushed out loses its Play
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
# server's largest cost beside training (bench/serving/visitors.py). Keep 100 events and summarize every 1,000.
# Gradio reads these when the queue is made; a value already in the environment wins.
GRADIO_QUEUE_ENV = {"GRADIO_ANALYTICS_MAX_EVENTS": "100", "GRADIO_ANALYTICS_CACHE_FREQUENCY": "1000"}


# Connections the app holds at once (`sqlenv.http_connections.ConnectionLimits`): one client (TCP peer) at most
# CONNECTIONS_PER_CLIENT (a browser opens at most 6 to a host; an office behind one address a few browsers), all
# clients together at most MAX_CONNECTIONS and half the process's descriptors (the rest are for its databases, run
# files, model files and the training process's pipes). 20,000 half-sent requests once took every descriptor.
CONNECTIONS_PER_CLIENT = 32
MAX_CONNECTIONS = 1024


def connection_limits(behind_proxy: bool) -> ConnectionLimits:
    """The app's bounds on connections. `behind_proxy`: clients come through trusted reverse proxies
    (`SQLENV_PROXY_HOPS`, `FORWARDED_ALLOW_IPS`, a Space), so every connection's TCP peer is a proxy: no bound per
    peer then (the proxy bounds its own clients' requests), the total only."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    total = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(1, min(MAX_CONNECTIONS, soft // 2))
    return ConnectionLimits(total, per_client=None if behind_proxy else CONNECTIONS_PER_CLIENT)


def launch(demo: gr.Blocks, host: str, port: int, prevent_thread_lock: bool = False,
           proxy_hops: int = 0) -> uvicorn.Server:
    """Serve `demo` on `host`:`port` until interrupted (Ctrl-C), or in a background thread with
    `prevent_thread_lock`; returns the server. OSError when the port cannot be listened on.

    Gradio's own `launch` starts uvicorn with its defaults, which wait for a request head for ever: here the Blocks
    are mounted with `gr.mount_gradio_app` (the same settings `launch` would take) and served by uvicorn with
    `sqlenv.http_connections.http_protocol`, so that a connection has `SQLENV_APP_BODY_TIMEOUT_S` (10 s) to send
    each request head, as its body, and connections are bounded (`connection_limits`). `proxy_hops` (the access
    policy's) says whether clients come through proxies. uvicorn trusts no proxy's `X-Forwarded-For` unless the
    operator set `FORWARDED_ALLOW_IPS` (`trusted_proxies_setting`)."""
    for name, value in GRADIO_QUEUE_ENV.items():
        os.environ.setdefault(name, value)
    demo.queue(default_concurrency_limit=4, max_size=QUEUE_MAX_EVENTS)
    tune_queue(demo)
    demo.state_session_capacity = sessions_kept()  # what `launch(state_session_capacity=...)` sets
    plotly_js = plotly_js_path()  # the live charts' plotly.js, served from the installed package (offline)
    # The parent app only mounts the page: none of FastAPI's own documentation routes.
    app = gr.mount_gradio_app(
        FastAPI(docs_url=None, redoc_url=None, openapi_url=None), demo, path="/", server_name=host,
        server_port=port, css=CSS, theme=THEME, show_error=True, footer_links=[],
        allowed_paths=[str(plotly_js)] if plotly_js else None, max_file_size=MAX_UPLOAD_BYTES,
        root_path=os.environ.get("GRADIO_ROOT_PATH") or None,
        app_kwargs={"middleware": [Middleware(RequestGuard, blocks=demo)]},
    )
    trusted = trusted_proxies_setting()
    # Bound here, so that a port in use is an OSError for the caller (uvicorn would log it and exit).
    sock = socket.create_server((host.strip("[]"), port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=2048)
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", forwarded_allow_ips=trusted,
        http=http_protocol(body_timeout_s(), connection_limits(bool(proxy_hops or trusted)))))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="dashboard-server", daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    if not server.started:
        raise OSError(f"the server on {host}:{port} did not start")
    print(f"[dashboard] serving on http://{host}:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    if not prevent_thread_lock:
        try:
            while thread.is_alive():
                thread.join(0.5)
        except KeyboardInterrupt:
            server.should_exit = True
            thread.join(5)
    return server


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.config is not None and not args.config.is_file():
        print(f"app.py: --config {args.config}: no such file", file=sys.stderr)
        raise SystemExit(2)
    try:
        access = AccessPolicy.from_env(args.host)
        limits_from_env()
        sessions_kept()
        body_timeout_s()
    except ValueError as exc:  # a malformed owner or Play setting (SQLENV_PROXY_HOPS, ...): one line, exit 2
        print(f"app.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"[dashboard] training controls: {access.mode} ({access.reason})", file=sys.stderr)
    print(f"[dashboard] {address_source(access.proxy_hops)}", file=sys.stderr)
    ctx = AppContext.create(runs_root=choose_runs_root(args.runs_dir), data_root=args.data_dir,
                            default_config=args.config, access=access,
                            hub_repo=os.environ.get("SQLENV_HUB_REPO") or None)
    demo = build_app(ctx)
    try:
        launch(demo, args.host, args.port, proxy_hops=access.proxy_hops)
    except OSError as exc:  # port taken, bad host: one line, exit 2
        print(f"app.py: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
