"""The SQLEnv server: OpenEnv's FastAPI app around `SQLEnvServerEnvironment`.

    python -m sqlenv serve --dataset builtin --split train --host 127.0.0.1 --port 8000

Endpoints are OpenEnv's: `/ws` (one WebSocket per session: reset, step, state, close), the stateless
`/reset`, `/step`, `/state`, and `/health`, `/metadata`, `/schema`, `/docs`; with `web=True` also OpenEnv's
playground page at `/web` (one shared episode for every visitor). SQLEnv adds `GET /sessions`: how many
environments are open and the session limit, so a leak is visible from outside.

A session lives as long as its WebSocket: OpenEnv's HTTP way of opening one (`POST /mcp` with
`openenv/session/create`) is refused here, since a session no connection holds would take a slot for good
(16 such calls once filled a 16-session server). Sessions idle past `session_timeout_s` are closed (OpenEnv's
reaper), and no HTTP request body may exceed `MAX_HTTP_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import json
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.types import ConcurrencyConfig

from sqlenv.server.environment import ServerConfig, SQLEnvServerEnvironment
from sqlenv.server.models import EpisodeState, SQLAction, SQLObservation

__all__ = ["create_app", "serve", "DEFAULT_MAX_SESSIONS", "DEFAULT_SESSION_TIMEOUT_S", "WS_MAX_MESSAGE_BYTES",
           "MAX_HTTP_BODY_BYTES"]

#: Concurrent WebSocket sessions by default: TRL opens one per generation of a batch.
DEFAULT_MAX_SESSIONS = 64
#: Seconds a session may sit idle (no message) before the server closes it: far above a trainer's pause
#: between two rollouts, so only abandoned sessions go.
DEFAULT_SESSION_TIMEOUT_S = 600.0
#: The largest WebSocket message the server reads (a bigger one closes that connection; others go on).
WS_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: The largest HTTP request body (`/reset`, `/step`, `/mcp`): a bigger one is answered 413 unread.
MAX_HTTP_BODY_BYTES = 1024 * 1024

_SESSION_CREATE = "openenv/session/create"
#: Seconds between two `malloc_trim` calls (glibc only; see `_trim_freed_memory`).
TRIM_INTERVAL_S = 10.0


def _malloc_trim() -> Any:
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


async def _trim_freed_memory(trim: Any, interval_s: float) -> None:
    """Give memory that was freed back to the system every `interval_s` seconds.

    Each session steps on a thread of its own, and glibc gives each thread an arena it never shrinks: what one
    session's large statement allocated (up to SQLite's heap limit) stays in the process after it is freed,
    arena after arena, as sessions come and go. `malloc_trim(0)` returns those free pages (measured: 470 MB of
    RSS down to 171 MB after 400 short-lived sessions' sorts)."""
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(trim, 0)


class _HttpGuard:
    """ASGI middleware in front of OpenEnv's HTTP routes: bodies over `max_body` bytes get 413 (read no further),
    and a JSON-RPC `openenv/session/create` on `POST /mcp` gets a JSON-RPC error (sessions come with a WebSocket).
    WebSocket traffic passes untouched (uvicorn's `ws_max_size` bounds its messages)."""

    def __init__(self, app: Any, max_body: int = MAX_HTTP_BODY_BYTES):
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body:
            await self._reply(send, 413, {"detail": f"request body over {self.max_body} bytes"})
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                await self._reply(send, 413, {"detail": f"request body over {self.max_body} bytes"})
                return
        if scope.get("path", "").rstrip("/").endswith("/mcp") and _SESSION_CREATE.encode() in body:
            try:
                request = json.loads(body)
            except ValueError:
                request = None
            if isinstance(request, dict) and request.get("method") == _SESSION_CREATE:
                await self._reply(send, 200, {"jsonrpc": "2.0", "id": request.get("id"), "error": {
                    "code": -32601, "message": "Sessions are opened by connecting to /ws; "
                                               "openenv/session/create over HTTP is disabled on this server."}})
                return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    @staticmethod
    async def _reply(send: Any, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def create_app(config: ServerConfig, *, max_sessions: int = DEFAULT_MAX_SESSIONS, web: bool = False,
               session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S) -> FastAPI:
    """The FastAPI app serving `config`.

    Args:
        config: what every session plays (questions, databases, limits), e.g. `ServerConfig.from_dataset(...)`.
        max_sessions: most concurrent WebSocket sessions (default 64); one more gets a `CAPACITY_REACHED` error.
        web: also mount OpenEnv's playground page at `/web` (default False). It plays one episode shared by
            every visitor, as OpenEnv's environments do on a Space.
        session_timeout_s: seconds a session may go without a message before the server closes it (default
            600; OpenEnv's reaper looks every quarter of it, at least every 5 s). A client that comes back later
            gets an error and opens a new session.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    if not session_timeout_s > 0:
        raise ValueError(f"session_timeout_s must be > 0, got {session_timeout_s}")
    concurrency = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout_s)
    factory = functools.partial(SQLEnvServerEnvironment, config)
    if web:
        from openenv.core.env_server.web_interface import create_web_interface_app

        app = create_web_interface_app(factory, SQLAction, SQLObservation, env_name="sqlenv",
                                       concurrency_config=concurrency, state_cls=EpisodeState,
                                       title_override="SQLEnv")
    else:
        app = create_fastapi_app(factory, SQLAction, SQLObservation, concurrency_config=concurrency,
                                 env_name="sqlenv", state_cls=EpisodeState)
    app.add_middleware(_HttpGuard)
    trim = _malloc_trim()
    if trim is not None:
        tasks: list[asyncio.Task] = []

        async def start_trimming() -> None:
            tasks.append(asyncio.create_task(_trim_freed_memory(trim, TRIM_INTERVAL_S)))

        async def stop_trimming() -> None:
            for task in tasks:
                task.cancel()

        app.router.on_startup.append(start_trimming)
        app.router.on_shutdown.append(stop_trimming)

    @app.get("/sessions", tags=["Health"], summary="Open environments and the session limit")
    async def sessions() -> dict[str, Any]:
        return {"open": config.sessions.open, "max": max_sessions}

    return app


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, *,
          max_sessions: int = DEFAULT_MAX_SESSIONS, web: bool = False, log_level: str = "warning",
          session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S) -> None:
    """Run the server in this process until interrupted (uvicorn; SIGINT/SIGTERM stop it cleanly).

    Args:
        config: what every session plays.
        host: interface to bind (default 127.0.0.1; a container or Space binds 0.0.0.0).
        port: TCP port (default 8000).
        max_sessions: most concurrent WebSocket sessions (default 64).
        web: mount the playground page at `/web` (default False).
        log_level: uvicorn's log level (default "warning": one line per request would cost more than a step).
        session_timeout_s: seconds an idle session is kept (default 600).
    """
    import gc

    import uvicorn

    app = create_app(config, max_sessions=max_sessions, web=web, session_timeout_s=session_timeout_s)
    # Everything loaded so far (FastAPI, OpenEnv, Gradio, the questions) lives as long as the process: keep it
    # out of the garbage collector's full passes, which otherwise stall every session for ~0.2 s now and then.
    gc.collect()
    gc.freeze()
    print(f"sqlenv server: {config.dataset or 'dataset'}/{config.split} ({len(config.questions)} questions) on "
          f"http://{host}:{port} (WebSocket /ws, at most {max_sessions} sessions{', playground /web' if web else ''})",
          flush=True)
    # No per-message compression: observations are small text, and deflating every frame costs more CPU on
    # both ends than the bytes it saves.
    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=WS_MAX_MESSAGE_BYTES,
                ws_per_message_deflate=False)
