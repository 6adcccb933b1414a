"""`python -m sqlenv serve`: the environment over HTTP/WebSocket as an OpenEnv server (needs `sqlenv[server]`).

    python -m sqlenv serve --dataset builtin --split train --host 127.0.0.1 --port 8000

The server's configuration is this command line (the Dockerfile runs it with `--host 0.0.0.0 --web`).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from sqlenv.cli.arguments import CLIError, nonnegative_int, one_line, port, positive_float, positive_int
from sqlenv.cli.environments import resolve
from sqlenv.client_address import PROXY_HOPS_ENV, proxy_hops_setting


def add_parser(commands: Any) -> None:
    """Add `serve` to the top parser's `commands`."""
    srv = commands.add_parser("serve", help="serve the environment over HTTP/WebSocket (OpenEnv; needs sqlenv[server])")
    srv.add_argument("--dataset", default="builtin", help="dataset name or path (default: builtin)")
    srv.add_argument("--split", default="train", help="split served (default: train)")
    srv.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    srv.add_argument("--port", type=port, default=8000, help="TCP port (default 8000)")
    srv.add_argument("--budget", type=positive_int, default=15,
                     help="step budget when a reset asks for none (default 15)")
    srv.add_argument("--max-sessions", type=positive_int, default=64,
                     help="most concurrent WebSocket sessions (default 64)")
    srv.add_argument("--session-timeout", type=positive_float, default=600.0,
                     help="seconds an idle session is kept before the server closes it (default 600)")
    srv.add_argument("--request-timeout", type=positive_float, default=10.0,
                     help="seconds a connection has to send a request head, and a POST its body, before the server "
                          "closes it (default 10)")
    srv.add_argument("--max-sessions-per-client", type=positive_int, default=16,
                     help="most concurrent WebSocket sessions of one client address (default 16; a trainer opens "
                          "one per generation of a batch)")
    srv.add_argument("--reset-timeout", type=positive_float, default=20.0,
                     help="seconds a new WebSocket has to send its first reset before the server closes it "
                          "(default 20)")
    srv.add_argument("--proxy-hops", type=nonnegative_int, default=None,
                     help="trusted reverse proxies in front of the server, each appending to X-Forwarded-For: the "
                          "per-client limit counts the entry the outermost one appended (default: "
                          "SQLENV_PROXY_HOPS, else 0 = the TCP peer; never more than the proxies there are; not "
                          "with FORWARDED_ALLOW_IPS)")
    srv.add_argument("--web", action="store_true",
                     help="also serve the playground page at /web/ (each visitor plays a session of their own over /ws)")
    srv.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="warning",
                     help="uvicorn log level (default warning)")
    srv.set_defaults(run=run)


def server_stack() -> tuple[Any, Any]:
    """`(serve, ServerConfig)`, imported for a process that only serves, without OpenEnv's Gradio web interface.

    OpenEnv's `env_server` package imports its shared-episode web interface, and with it Gradio, whenever Gradio is
    installed, and takes it to be absent otherwise (`create_web_interface_app` is then None). This server never
    serves that interface (`--web` is SQLEnv's own playground page), and Gradio is installed beside it for the
    dashboard: importing it cost every server ~4 s of CPU at start and ~120 MB of resident memory. So, in a process
    that has not imported it yet, Gradio is marked not importable (a None entry in `sys.modules`, which Python's import
    system reads as "not found") before OpenEnv loads.
    """
    import sys

    if "openenv" not in sys.modules:
        sys.modules.setdefault("gradio", None)  # type: ignore[arg-type]
    from sqlenv.server.app import serve
    from sqlenv.server.environment import ServerConfig

    return serve, ServerConfig


def run(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    """Serve until stopped; the dataset and split are checked before the server stack is imported."""
    try:  # bad input first: the server stack takes seconds to import
        hops = proxy_hops_setting(args.proxy_hops, name=PROXY_HOPS_ENV if args.proxy_hops is None else "--proxy-hops")
    except ValueError as exc:
        raise CLIError(one_line(exc)) from None
    info = resolve(args.dataset)
    try:
        info.questions_path(args.split)
    except ValueError as exc:
        raise CLIError(one_line(exc)) from None
    try:
        serve, ServerConfig = server_stack()
    except ImportError as exc:
        raise CLIError(one_line(exc)) from None
    try:
        config = ServerConfig.from_dataset(info.root, split=args.split, step_budget=args.budget)
    except ValueError as exc:
        raise CLIError(one_line(exc)) from None
    try:
        serve(config, host=args.host, port=args.port, max_sessions=args.max_sessions, web=args.web,
              log_level=args.log_level, session_timeout_s=args.session_timeout,
              request_timeout_s=args.request_timeout, max_sessions_per_client=args.max_sessions_per_client,
              reset_timeout_s=args.reset_timeout, proxy_hops=hops)
    except OSError as exc:  # the port in use, or not ours to bind
        raise CLIError(one_line(exc)) from None
    return 0
