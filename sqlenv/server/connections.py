"""How the server takes connections: its listening sockets, and uvicorn's HTTP protocol with a deadline on
request heads.

Why several listening sockets: uvicorn's event loop (uvloop, over libuv) accepts one connection per listening
socket per turn of the loop. Under load a turn takes 0.1-0.3 s on two cores (64 honest and 64 hostile
sessions), so a client that opens connections in a loop (a hostile session reconnecting for each attack) kept
the kernel's queue of connections waiting to be accepted full, and every newcomer waited its turn behind them:
`/health` took 2.5-3.6 s while it spent 0.01 s in the app and honest steps on open connections took 0.7 s
(traced in docs/EXPERIMENTS.md section 12: a probe's connection was accepted 3.3 s after its TCP handshake).
`LISTENERS` sockets bound to one port with `SO_REUSEPORT` share the connections (the kernel spreads them by
address and port), and the loop accepts from each of them every turn: the same soak's `/health` stayed under
0.81 s. Python's own asyncio loop accepts up to 100 at once, but is twice as slow at everything else.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

__all__ = ["LISTENERS", "http_protocol", "listening_sockets"]

#: Listening sockets sharing the server's port (`listening_sockets`): the connections the loop can accept in one
#: turn. 16 held `/health` under 1 s with 64 hostile sessions reconnecting; 64 did no better.
LISTENERS = 16


def listening_sockets(host: str, port: int, count: int = LISTENERS) -> list[socket.socket]:
    """`count` TCP sockets listening on `host`:`port`, bound as uvicorn binds its own (IPv6 when `host` has a
    colon, `SO_REUSEADDR`), sharing the port through `SO_REUSEPORT`; for `uvicorn.Server.run(sockets=...)`.

    Port 0 takes one free port for all of them. Where the system has no `SO_REUSEPORT` (Windows) there is one
    socket. Linux lets only processes of the same user bind a port so shared, and spreads connections over
    every socket bound to it, so another process of that user could take a share of them: the same user can
    already stop or read this one. Raises OSError when the port cannot be bound."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not hasattr(socket, "SO_REUSEPORT"):
        count = 1
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if count > 1:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]  # port 0: the rest share the one the first was given
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def http_protocol(request_timeout_s: float) -> type:
    """uvicorn's HTTP/1.1 protocol class (httptools, else h11: the one uvicorn's "auto" picks) with a deadline on
    request heads, for `uvicorn.Config(http=...)`.

    uvicorn bounds only the silence between two requests of a kept-alive connection (`timeout_keep_alive`): a
    connection that opens and sends part of a request head, or nothing, is kept for ever (400 such connections
    were held open at once). Here a connection has `request_timeout_s` to complete each request head, counted
    from when the server starts waiting for it (the connection opened, or the previous response ended), and is
    closed when it has not. The head is complete when uvicorn starts a new request cycle (or hands the
    connection to the WebSocket protocol), which both parsers do as soon as they have read it."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeadDeadlineProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _sqlenv_head_timer: asyncio.TimerHandle | None = None
        _sqlenv_waiting_after: Any = None  # the request cycle before the head awaited (None: the first)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._sqlenv_await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._sqlenv_head_timer is not None and self.cycle is not self._sqlenv_waiting_after:
                self._sqlenv_stop_timer()  # a head was read: uvicorn started its request cycle

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Kept alive, and no pipelined request already read: the next head is awaited from now.
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._sqlenv_await_head()

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._sqlenv_stop_timer()  # the WebSocket protocol takes the connection over
            super().handle_websocket_upgrade(*args)

        def connection_lost(self, exc: Exception | None) -> None:
            self._sqlenv_stop_timer()
            super().connection_lost(exc)

        def _sqlenv_await_head(self) -> None:
            self._sqlenv_stop_timer()
            self._sqlenv_waiting_after = self.cycle
            self._sqlenv_head_timer = self.loop.call_later(request_timeout_s, self._sqlenv_head_late)

        def _sqlenv_stop_timer(self) -> None:
            if self._sqlenv_head_timer is not None:
                self._sqlenv_head_timer.cancel()
                self._sqlenv_head_timer = None

        def _sqlenv_head_late(self) -> None:
            self._sqlenv_head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineProtocol
