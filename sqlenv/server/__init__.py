"""SQLEnv as an OpenEnv environment: a server, its typed client, and `SQLEnvironment` over the wire.

Needs the `server` extra (`pip install "sqlenv[server]"`, which installs PyPI's `openenv`, imported as
`openenv.core`); the rest of `sqlenv` never imports this package, so the core keeps no web dependency.

- `sqlenv.server.models`: the wire types `SQLAction`, `SQLObservation`, `EpisodeState` (OpenEnv models);
- `sqlenv.server.environment`: `SQLEnvServerEnvironment` (one `SQLEnvironment` per session), `ServerConfig`;
- `sqlenv.server.app`: `create_app(config)` (OpenEnv's FastAPI app plus `/sessions`) and `serve(...)`;
- `sqlenv.server.playground`: the page `--web` serves at `/web/` (it plays over `/ws`);
- `sqlenv.server.json_values`: how many JSON values a message holds, counted before it is parsed;
- `sqlenv.server.websocket_guard`: one guard for every WebSocket route (sessions per client and their share,
  the idle and reset clocks, the message bound); `sqlenv.server.connections`: the listening sockets and what a
  WebSocket connection may make the server hold;
- `sqlenv.server.client`: `SQLEnvClient`, OpenEnv's `EnvClient` with SQLEnv's types;
- `sqlenv.server.remote`: `RemoteSQLEnvironment`, `SQLEnvironment`'s interface on a server (for training).

Run one with `python -m sqlenv serve --dataset builtin --host 127.0.0.1 --port 8000`.

May import: the core (`types`, `protocol`, `environment`, `rewards`, `transcript`, `client_address`, `asgi_body`,
`http_connections`), `sqlenv.data` and `sqlenv.sandbox`; only `sqlenv.cli` imports it.
"""

from __future__ import annotations

from sqlenv import lazy_exports

try:
    import openenv.core  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError('sqlenv.server needs OpenEnv: pip install "sqlenv[server]" (PyPI package `openenv`)') from err

_EXPORTS = {
    "SQLAction": "sqlenv.server.models",
    "SQLObservation": "sqlenv.server.models",
    "EpisodeState": "sqlenv.server.models",
    "ServerConfig": "sqlenv.server.environment",
    "SQLEnvServerEnvironment": "sqlenv.server.environment",
    "create_app": "sqlenv.server.app",
    "serve": "sqlenv.server.app",
    "SQLEnvClient": "sqlenv.server.client",
    "RemoteSQLEnvironment": "sqlenv.server.remote",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
