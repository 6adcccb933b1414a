"""The SQLEnv server: OpenEnv's FastAPI app around `SQLEnvServerEnvironment`.

    python -m sqlenv serve --dataset builtin --split train --host 127.0.0.1 --port 8000

Endpoints are OpenEnv's: `/ws` (one WebSocket per session: reset, step, state, close), the stateless
`/reset`, `/step`, `/state`, and `/health`, `/metadata`, `/schema`, `/docs`; with `web=True` also OpenEnv's
playground page at `/web` (one shared episode for every visitor). SQLEnv adds `GET /sessions`: how many
environments are open and the session limit, so a leak is visible from outside.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_fastapi_app

from sqlenv.server.environment import ServerConfig, SQLEnvServerEnvironment
from sqlenv.server.models import EpisodeState, SQLAction, SQLObservation

__all__ = ["create_app", "serve", "DEFAULT_MAX_SESSIONS", "WS_MAX_MESSAGE_BYTES"]

#: Concurrent WebSocket sessions by default: TRL opens one per generation of a batch.
DEFAULT_MAX_SESSIONS = 64
#: The largest WebSocket message the server reads (a bigger one closes that connection; others go on).
WS_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def create_app(config: ServerConfig, *, max_sessions: int = DEFAULT_MAX_SESSIONS, web: bool = False) -> FastAPI:
    """The FastAPI app serving `config`.

    Args:
        config: what every session plays (questions, databases, limits), e.g. `ServerConfig.from_dataset(...)`.
        max_sessions: most concurrent WebSocket sessions (default 64); one more gets a `CAPACITY_REACHED` error.
        web: also mount OpenEnv's playground page at `/web` (default False). It plays one episode shared by
            every visitor, as OpenEnv's environments do on a Space.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    factory = functools.partial(SQLEnvServerEnvironment, config)
    if web:
        from openenv.core.env_server.web_interface import create_web_interface_app

        app = create_web_interface_app(factory, SQLAction, SQLObservation, env_name="sqlenv",
                                       max_concurrent_envs=max_sessions, state_cls=EpisodeState,
                                       title_override="SQLEnv")
    else:
        app = create_fastapi_app(factory, SQLAction, SQLObservation, max_concurrent_envs=max_sessions,
                                 env_name="sqlenv", state_cls=EpisodeState)

    @app.get("/sessions", tags=["Health"], summary="Open environments and the session limit")
    async def sessions() -> dict[str, Any]:
        return {"open": config.sessions.open, "max": max_sessions}

    return app


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, *,
          max_sessions: int = DEFAULT_MAX_SESSIONS, web: bool = False, log_level: str = "warning") -> None:
    """Run the server in this process until interrupted (uvicorn; SIGINT/SIGTERM stop it cleanly).

    Args:
        config: what every session plays.
        host: interface to bind (default 127.0.0.1; a container or Space binds 0.0.0.0).
        port: TCP port (default 8000).
        max_sessions: most concurrent WebSocket sessions (default 64).
        web: mount the playground page at `/web` (default False).
        log_level: uvicorn's log level (default "warning": one line per request would cost more than a step).
    """
    import gc

    import uvicorn

    app = create_app(config, max_sessions=max_sessions, web=web)
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
