"""The SQLEnv server: OpenEnv's FastAPI app around `SQLEnvServerEnvironment`.

    python -m sqlenv serve --dataset builtin --split train --host 127.0.0.1 --port 8000

Endpoints are OpenEnv's: `/ws` (one WebSocket per session: reset, step, state, close), the stateless
`/reset`, `/step`, `/state`, and `/health`, `/metadata`, `/schema`, `/docs`; with `web=True` also SQLEnv's own
playground page at `/web/` (`sqlenv.server.playground`: each visitor plays a session of their own over `/ws`;
OpenEnv's shared-episode web interface is not served). SQLEnv adds `GET /sessions`: how many environments are
open and the session limit, so a leak is visible from outside.

A session lives as long as its WebSocket, and a WebSocket as long as its client speaks and reads:
- OpenEnv's HTTP way of opening a session (`POST /mcp` with `openenv/session/create`) is refused, judged on the
  parsed JSON-RPC request (batches too), since a session no connection holds would take a slot for good
  (16 such calls once filled a 16-session server);
- every WebSocket route (`/ws`, OpenEnv's `/mcp`, any later one) goes through one guard
  (`sqlenv.server.websocket_guard`): a WebSocket that keeps the server waiting on it for `session_timeout_s`
  (for a message, or to read a reply), or sends no `reset` within `reset_timeout_s` of connecting, is closed,
  which ends its session. OpenEnv's own idle reaper is off: it freed the environment but left the WebSocket
  playing on outside the session limit;
- one client address holds at most `max_sessions_per_client` WebSockets at once, and no more than the sessions
  the other clients leave free, so neither one client nor a few can take every slot. Behind `proxy_hops`
  trusted reverse proxies (a Space has one) the address is the one they appended to `X-Forwarded-For`
  (`sqlenv.client_address`), not the proxy's;
- a connection whose client does not read what it was sent reads nothing more from it (pings included), every
  frame a client sends is charged to one allowance (frames and bytes per second, fragments per message: a flood of
  frames that complete no message is aborted), and a connection is aborted once its session has ended
  (`sqlenv.server.connections.websocket_protocol`).
Every connection must also send its request head within `request_timeout_s` (and a POST body within as long
again), no HTTP request body may exceed `MAX_HTTP_BODY_BYTES` nor a WebSocket message `WS_MAX_MESSAGE_BYTES`,
neither may hold more than `MAX_JSON_VALUES` JSON values (`sqlenv.server.json_values`: refused before anything
parses it), bad `/reset` values are answered 422, and no error reply carries the client's values back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.utils import is_body_allowed_for_status_code
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.types import ConcurrencyConfig
from starlette.exceptions import HTTPException as StarletteHTTPException

from sqlenv.asgi_body import BodyTooLarge, read_body, replaying
from sqlenv.client_address import FORWARDED_ALLOW_IPS_ENV, address_source, proxy_hops_setting
from sqlenv.sandbox.native_memory import fix_mmap_threshold, malloc_trim
from sqlenv.http_connections import http_protocol
from sqlenv.server.connections import listening_sockets, websocket_protocol
from sqlenv.server.environment import (PYTHON_SLOTS_ENV, PythonSlots, ResetArgumentError, ServerConfig,
                                      SQLEnvServerEnvironment, step_activity)
from sqlenv.server.json_values import MAX_JSON_VALUES, too_many_values
from sqlenv.server.loop_probe import HealthTimer, probe_path, run_probe
from sqlenv.server.models import EpisodeState, SQLAction, SQLObservation
from sqlenv.server.playground import add_playground
from sqlenv.server.websocket_guard import WebSocketGuard

__all__ = ["create_app", "serve", "DEFAULT_MAX_SESSIONS", "DEFAULT_SESSION_TIMEOUT_S", "DEFAULT_REQUEST_TIMEOUT_S",
           "DEFAULT_MAX_SESSIONS_PER_CLIENT", "DEFAULT_RESET_TIMEOUT_S", "WS_MAX_MESSAGE_BYTES", "MAX_HTTP_BODY_BYTES"]

#: Concurrent WebSocket sessions by default: TRL opens one per generation of a batch.
DEFAULT_MAX_SESSIONS = 64
#: Seconds a session may sit idle (no message) before the server closes it: far above a trainer's pause
#: between two rollouts, so only abandoned sessions go.
DEFAULT_SESSION_TIMEOUT_S = 600.0
#: WebSockets one client address may hold at once (`WebSocketGuard`): a trainer opens one per generation of a
#: batch, so one training against the server needs up to that many (raise it with `--max-sessions-per-client`).
DEFAULT_MAX_SESSIONS_PER_CLIENT = 16
#: Seconds a new WebSocket has to send its first `reset` before the server closes it (clients reset at once).
DEFAULT_RESET_TIMEOUT_S = 20.0
#: The largest WebSocket message the server reads (a bigger one closes that connection, unread; others go on):
#: the largest a client needs, an ANSWER of the longest answer the environment takes (1,000,000 characters,
#: `sqlenv.scoring.verifier.MAX_ANSWER_CHARS`, ASCII as JSON escapes it), plus 64 KiB for the rest of the message.
#: It was 16 MiB: uvicorn hands a message over whole, and one of 16 MiB of `{}`s held the event loop 2 s to parse.
WS_MAX_MESSAGE_BYTES = 1024 * 1024 + 64 * 1024
#: The largest HTTP request body (`/reset`, `/step`, `/mcp`): a bigger one is answered 413 unread.
MAX_HTTP_BODY_BYTES = 1024 * 1024
#: Seconds a connection has to send a request head (from when it opens, or from the end of the previous
#: response), and again to send a POST body: a client that holds connections half-sent is cut off.
DEFAULT_REQUEST_TIMEOUT_S = 10.0

_SESSION_CREATE = "openenv/session/create"
#: Seconds between two `malloc_trim` calls (glibc only; see `_trim_freed_memory`).
TRIM_INTERVAL_S = 10.0


async def _trim_freed_memory(trim: Any, interval_s: float) -> None:
    """Give memory that was freed back to the system every `interval_s` seconds.

    Each session steps on a thread of its own, and glibc gives each thread an arena it never shrinks: what one
    session's large statement allocated (up to SQLite's heap limit) stays in the process after it is freed,
    arena after arena, as sessions come and go. `malloc_trim(0)` returns those free pages (measured: 470 MB of
    RSS down to 171 MB after 400 short-lived sessions' sorts)."""
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(trim, 0)


def _creates_session(body: bytes) -> tuple[bool, Any]:
    """Whether a `POST /mcp` body asks OpenEnv to open a session, and the request id to answer with.

    The body is read as OpenEnv reads it (`json.loads` of the bytes, then the `method` of the object), so
    whatever spelling reaches OpenEnv's handler reaches this test too: escaped slashes (`openenv\\/session`),
    `\\u` escapes, UTF-16 bodies, repeated keys (the last one counts, for both). A batch (a JSON array) is refused
    when any of its requests is a session creation. A body that does not parse is left to OpenEnv, which fails it
    the same way."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (or nested too deep to read): OpenEnv answers a parse error
        return False, None
    requests = request if isinstance(request, list) else [request]
    creates = any(isinstance(r, dict) and r.get("method") == _SESSION_CREATE for r in requests)
    rid = request.get("id") if isinstance(request, dict) else None
    if not (isinstance(rid, int) and not isinstance(rid, bool) or isinstance(rid, str) and len(rid) <= 255):
        rid = None  # an id JSON-RPC does not allow, or one too long to send back
    return creates, rid


class _HttpGuard:
    """ASGI middleware in front of OpenEnv's HTTP routes, for requests with a body (POST, PUT, PATCH):

    - a body over `max_body` bytes gets 413 (read no further);
    - a body not received within `body_timeout_s` gets 408 (a client sending it a byte at a time holds nothing);
    - a body of more than `MAX_JSON_VALUES` JSON values gets 413, unparsed (`sqlenv.server.json_values`);
    - `POST /mcp` asking to open a session (`_creates_session`) gets a JSON-RPC error: sessions come with a
      WebSocket.

    Both replies close the connection. WebSocket traffic passes untouched (uvicorn's `ws_max_size` bounds its
    messages, `WebSocketGuard` their values, their number per client and their silences)."""

    def __init__(self, app: Any, max_body: int = MAX_HTTP_BODY_BYTES,
                 body_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S):
        self.app = app
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body:
            await self._reply(send, 413, {"detail": f"request body over {self.max_body} bytes"})
            return
        try:
            body = await read_body(receive, self.max_body, self.body_timeout_s)
        except BodyTooLarge:
            await self._reply(send, 413, {"detail": f"request body over {self.max_body} bytes"})
            return
        except TimeoutError:
            await self._reply(send, 408, {"detail": f"request body not received within {self.body_timeout_s:g} s"})
            return
        if body is None:
            return
        if too_many_values(body):
            await self._reply(send, 413, {"detail": f"request body of more than {MAX_JSON_VALUES} JSON values"})
            return
        if scope.get("path", "").rstrip("/").endswith("/mcp"):
            creates, rid = _creates_session(body)
            if creates:
                await self._reply(send, 200, {"jsonrpc": "2.0", "id": rid, "error": {
                    "code": -32601, "message": "Sessions are opened by connecting to /ws; "
                                               "openenv/session/create over HTTP is disabled on this server."}})
                return
        await self.app(scope, replaying(body, receive), send)

    @staticmethod
    async def _reply(send: Any, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        # `connection: close`: what is left of a refused body must not be read as the next request.
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


#: The most characters of an error's text (`detail`, `msg`) and of each part of its location an error reply keeps.
_ERROR_TEXT_CHARS, _ERROR_LOC_CHARS = 200, 60


def _error_detail(detail: Any) -> Any:
    """An error's `detail` as the server sends it: a list of validation errors (FastAPI's, or pydantic's that
    OpenEnv's `/step` raises as `HTTPException(422, e.errors())`) keeps where (`loc`, each part cut short: a key is
    the client's too), what (`msg`) and the error `type`, never the failing value (`input`, `ctx`); a text is cut
    short (OpenEnv's 404 quotes a path's environment name); anything else is named by its type."""
    if isinstance(detail, str):
        return detail[:_ERROR_TEXT_CHARS]
    if isinstance(detail, (list, tuple)):
        return [{"loc": [part if isinstance(part, int) else str(part)[:_ERROR_LOC_CHARS]
                         for part in (error.get("loc") or ())[:20]],
                 "msg": str(error.get("msg", ""))[:_ERROR_TEXT_CHARS], "type": str(error.get("type", ""))[:60]}
                if isinstance(error, dict) else type(error).__name__ for error in detail[:20]]
    return type(detail).__name__


async def _error_reply(request: Request, exc: Exception) -> Any:
    """The one place every error reply is made, for the routes OpenEnv registers as for the app's own: a request
    that fails its model (`RequestValidationError`) and any `HTTPException`, answered with their status and
    headers and `_error_detail` of their detail. FastAPI's own replies carry each failing value whole: a 1 MB
    `episode_id` to `/reset`, or a 1 MB field of `/step`'s action (OpenEnv raises that 422 itself), came back as
    1 MB (issue 49)."""
    if isinstance(exc, RequestValidationError):
        return JSONResponse({"detail": _error_detail(exc.errors())}, status_code=422)
    if not is_body_allowed_for_status_code(exc.status_code):
        return await http_exception_handler(request, exc)
    return JSONResponse({"detail": _error_detail(exc.detail)}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


def _run_while_serving(app: FastAPI, coroutine: Any) -> None:
    """Run `coroutine()` as a task from the app's startup until its shutdown."""
    tasks: list[asyncio.Task] = []

    async def start() -> None:
        tasks.append(asyncio.create_task(coroutine()))

    async def stop() -> None:
        for task in tasks:
            task.cancel()

    app.router.on_startup.append(start)
    app.router.on_shutdown.append(stop)


def create_app(config: ServerConfig, *, max_sessions: int = DEFAULT_MAX_SESSIONS, web: bool = False,
               session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
               request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
               max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
               reset_timeout_s: float = DEFAULT_RESET_TIMEOUT_S, proxy_hops: int = 0,
               python_slots: int | None = None) -> FastAPI:
    """The FastAPI app serving `config`.

    Args:
        config: what every session plays (questions, databases, limits), e.g. `ServerConfig.from_dataset(...)`.
        max_sessions: most concurrent WebSocket sessions (default 64); one more gets a `CAPACITY_REACHED` error.
        web: also serve SQLEnv's playground page at `/web/` (default False; `/` redirects there). Each visitor
            plays a session of their own over `/ws`, under every limit below (`sqlenv.server.playground`).
        session_timeout_s: seconds a WebSocket may keep the server waiting on it (for its next message, or to
            read a reply) before the server closes it, and its session with it (default 600). A client that comes
            back later finds the connection closed and opens a new one (`RemoteSQLEnvironment` does so at its
            next reset).
        request_timeout_s: seconds a client has to send a request body once its head is read (default 10; the
            head's own deadline is the HTTP protocol's, set by `serve`).
        max_sessions_per_client: most WebSockets one client address (an IPv6 one: its /64) may hold at once
            (default 16); one more gets `CAPACITY_REACHED`. A trainer opens one per generation of a batch: serve
            a training with at least that many. A client that holds some gets one more only while more than it
            holds are free, unless no other client holds any (`sqlenv.server.websocket_guard.SessionShares`).
        reset_timeout_s: seconds a new WebSocket has to send its first `reset` before the server closes it
            (default 20; clients reset as soon as they connect).
        proxy_hops: trusted reverse proxies in front of the server, each appending to `X-Forwarded-For`
            (default 0: the TCP peer is the client). The per-client limit then counts the entry the outermost
            proxy appended. Set it to the number of proxies, never more (one more and the entry counted is the
            client's own claim), and only where every request comes through them.
        python_slots: most sessions running a reset's or step's Python work at once, process-wide (default None:
            `config.python_slots`, no bound); statements run outside it (`PythonSlots`).
    """
    if python_slots is not None:
        config.python_slots = PythonSlots(python_slots)
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    if not session_timeout_s > 0:
        raise ValueError(f"session_timeout_s must be > 0, got {session_timeout_s}")
    if not request_timeout_s > 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
    if max_sessions_per_client < 1:
        raise ValueError(f"max_sessions_per_client must be at least 1, got {max_sessions_per_client}")
    if not reset_timeout_s > 0:
        raise ValueError(f"reset_timeout_s must be > 0, got {reset_timeout_s}")
    if not isinstance(proxy_hops, int) or proxy_hops < 0:
        raise ValueError(f"proxy_hops must be a non-negative integer, got {proxy_hops!r}")
    # No reaper (session_timeout=None): `WebSocketGuard` closes silent connections, which ends their sessions.
    concurrency = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None)
    factory = functools.partial(SQLEnvServerEnvironment, config)
    app = create_fastapi_app(factory, SQLAction, SQLObservation, concurrency_config=concurrency,
                             env_name="sqlenv", state_cls=EpisodeState)
    if web:
        add_playground(app)
    app.add_middleware(_HttpGuard, body_timeout_s=request_timeout_s)
    app.add_middleware(WebSocketGuard, router=app.router, max_sessions=max_sessions, idle_s=session_timeout_s,
                       reset_s=reset_timeout_s, per_client=max_sessions_per_client, proxy_hops=proxy_hops)

    async def refuse_reset(request: Request, exc: ResetArgumentError) -> JSONResponse:
        # A client's bad value (OpenEnv's /reset lets the environment's ValueError become a 500).
        return JSONResponse({"detail": str(exc)}, status_code=422)

    app.add_exception_handler(ResetArgumentError, refuse_reset)
    app.add_exception_handler(RequestValidationError, _error_reply)
    app.add_exception_handler(StarletteHTTPException, _error_reply)
    fix_mmap_threshold()  # big freed blocks go back to the system (see sqlenv.sandbox.native_memory)
    trim = malloc_trim()
    if trim is not None:
        _run_while_serving(app, lambda: _trim_freed_memory(trim, TRIM_INTERVAL_S))
    probe_file = probe_path()
    if probe_file is not None:  # bench only (SQLENV_LOOP_PROBE_FILE): the event loop's lateness, to a file
        _run_while_serving(app, lambda: run_probe(probe_file, step_activity))
        app.add_middleware(HealthTimer)

    @app.get("/sessions", tags=["Health"], summary="Open environments and the session limit")
    async def sessions() -> dict[str, Any]:
        return {"open": config.sessions.open, "max": max_sessions}

    return app


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, *,
          max_sessions: int = DEFAULT_MAX_SESSIONS, web: bool = False, log_level: str = "warning",
          session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
          request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
          max_sessions_per_client: int = DEFAULT_MAX_SESSIONS_PER_CLIENT,
          reset_timeout_s: float = DEFAULT_RESET_TIMEOUT_S, proxy_hops: int | None = None,
          python_slots: int | None = None) -> None:
    """Run the server in this process until interrupted (uvicorn; SIGINT/SIGTERM stop it cleanly).

    Args:
        config: what every session plays.
        host: interface to bind (default 127.0.0.1; a container or Space binds 0.0.0.0).
        port: TCP port (default 8000).
        max_sessions: most concurrent WebSocket sessions (default 64).
        web: serve the playground page at `/web/` (default False).
        log_level: uvicorn's log level (default "warning": one line per request would cost more than a step).
        session_timeout_s: seconds an idle session is kept (default 600).
        request_timeout_s: seconds a connection has to send each request head, and a POST its body (default 10).
        max_sessions_per_client: most WebSockets one client address may hold at once (default 16).
        reset_timeout_s: seconds a new WebSocket has to send its first reset (default 20).
        proxy_hops: trusted reverse proxies appending to `X-Forwarded-For` (default None: `SQLENV_PROXY_HOPS`,
            else 1 on a HuggingFace Space, else 0: `sqlenv.client_address.proxy_hops_setting`); see `create_app`.
            The start log says which address source the server uses.
        python_slots: most sessions running a step's Python work at once (default None: `SQLENV_PYTHON_SLOTS`,
            else no bound); see `PythonSlots`.

    Raises OSError (one line) when `host`:`port` cannot be listened on, e.g. a port in use.

    Client addresses are TCP peers unless one setting names the proxies: `proxy_hops` (how many append to
    `X-Forwarded-For`), or uvicorn's `FORWARDED_ALLOW_IPS` (their addresses; default none here: uvicorn's own
    default, 127.0.0.1, let any local client name a new address per connection). Both at once raise ValueError.
    """
    import gc

    import uvicorn

    proxy_hops = proxy_hops_setting(proxy_hops)
    if python_slots is None and os.environ.get(PYTHON_SLOTS_ENV, "").strip():
        try:
            python_slots = int(os.environ[PYTHON_SLOTS_ENV])
        except ValueError:
            raise ValueError(f"{PYTHON_SLOTS_ENV} must be a whole number, got "
                             f"{os.environ[PYTHON_SLOTS_ENV]!r}") from None
    app = create_app(config, max_sessions=max_sessions, web=web, session_timeout_s=session_timeout_s,
                     request_timeout_s=request_timeout_s, max_sessions_per_client=max_sessions_per_client,
                     reset_timeout_s=reset_timeout_s, proxy_hops=proxy_hops, python_slots=python_slots)
    # Several sockets on the port, each accepted from every turn of the loop (sqlenv.server.connections);
    # bound before anything is served, so a port in use is an OSError here.
    try:
        sockets = listening_sockets(host, port)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    port = sockets[0].getsockname()[1]
    # Everything loaded so far (FastAPI, OpenEnv, Gradio, the questions) lives as long as the process: keep it
    # out of the garbage collector's full passes, which otherwise stall every session for ~0.2 s now and then.
    gc.collect()
    gc.freeze()
    shown_host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL is bracketed
    print(f"sqlenv server: {config.dataset or 'dataset'}/{config.split} ({len(config.questions)} questions) on "
          f"http://{shown_host}:{port} (WebSocket /ws, at most {max_sessions} sessions"
          f"{', playground /web' if web else ''}, {config.python_slots.slots or 'no bound on'} Python slot(s))\n"
          f"sqlenv server: {address_source(proxy_hops)}", flush=True)
    # No per-message compression: observations are small text, and deflating every frame costs more CPU on
    # both ends than the bytes it saves.
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level=log_level, ws_max_size=WS_MAX_MESSAGE_BYTES,
        ws_per_message_deflate=False, http=http_protocol(request_timeout_s), ws=websocket_protocol(),
        forwarded_allow_ips=os.environ.get(FORWARDED_ALLOW_IPS_ENV, "")))
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    finally:
        for sock in sockets:
            sock.close()
    if not server.started:
        raise SystemExit(3)  # uvicorn's startup failure (STARTUP_FAILURE), as `uvicorn.run` exits
