"""How the server takes connections: its listening sockets, and what a WebSocket connection may make it hold
(`websocket_protocol`). uvicorn's HTTP protocol with a deadline on request heads is
`sqlenv.http_connections.http_protocol`, which the dashboard uses too.

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

__all__ = ["LISTENERS", "LINGER_S", "SEND_BUFFER_BYTES", "CONTROL_BURST", "CONTROL_PER_S", "listening_sockets",
           "websocket_protocol"]

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


#: Seconds a WebSocket connection may outlive the app's part in it (its close frame sent, or the app returned):
#: uvicorn waits 10 s for the client's answer to a close frame, then closes, which waits for the client to take
#: what is still buffered. Past these seconds the connection is aborted, its buffer dropped.
LINGER_S = 12.0
#: The kernel's send buffer of a WebSocket connection (SO_SNDBUF; Linux doubles it). Left to itself Linux grows it to
#: 4 MB (`tcp_wmem`), and a client that never reads can make the server parse that many bytes of its pings (~32,000
#: frames) and write their pongs before its output backs up: four such clients held `/health` 1.57 s at load 7.
#: 256 KiB bounds that work to a few thousand frames a connection (`/health` 0.23 s), and a reply still goes out
#: 512 KiB a round trip.
SEND_BUFFER_BYTES = 256 * 1024
#: Control frames (pings, pongs) a WebSocket client may send at once, and per second after that. A client's keepalive
#: pings every 20 s or so (OpenEnv's and `websockets`' clients), a browser never. uvicorn parses and answers each at
#: once, outside the pace the app sets for messages (one at a time): a flood of them costs the event loop ~4 us a
#: frame to parse (websockets' parser, on this machine), more to answer, so past the allowance the connection is
#: aborted (its session ends with it).
CONTROL_BURST, CONTROL_PER_S = 32, 1.0


def websocket_protocol() -> type:
    """uvicorn's WebSocket protocol (websockets' sans-I/O implementation, the one uvicorn's "auto" picks) with three
    bounds at the transport, for `uvicorn.Config(ws=...)`:

    - Unread output stops reading: while the transport holds more unsent bytes than its high-water mark (64 KiB:
      the client is not reading what it was sent, and the kernel's send buffer, `SEND_BUFFER_BYTES`, is full), the
      connection reads nothing more from the client. uvicorn's `send` already waits there with the app's replies,
      but it answers each ping at once with a pong written past any bound, and stops reading only while a data
      message waits for the app: a client that sent pings and never read made the server keep every pong (issue
      49: 500 MB of pings, RSS 282 -> 738 MB, held while the client stayed). Now a connection holds at most the
      mark plus one read's pongs (~0.3 MB), and the client's pings wait in its own buffers. uvicorn's "websockets"
      implementation (deprecated) waits for the buffer to drain before each pong, "wsproto" writes them as
      "websockets-sansio" does.
    - Control frames have an allowance: `CONTROL_BURST` pings and pongs at once, `CONTROL_PER_S` a second after
      that; past it the connection is aborted. Data messages are paced by the app (uvicorn reads the next once
      the app took the last); control frames were not: four clients' floods held `/health` 1.3-2.8 s at load 7
      while the server parsed what it had read before their output backed up.
    - An ended connection ends: `LINGER_S` after the app's part in it ended (`run_asgi` returned), a connection
      still open is aborted. A graceful close waits for the client to take what is buffered, which a client that
      never reads never does: the socket and its buffer were held as long as the client stayed.

    When the server stops reading, or ends a connection, is decided above it (`sqlenv.server.websocket_guard`: the
    idle and reset clocks, bounded whatever the client does)."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
        _sqlenv_output_waits = False  # the transport's unsent bytes are over its high-water mark
        _sqlenv_linger: asyncio.TimerHandle | None = None
        _sqlenv_lost = False

        _sqlenv_allowance = float(CONTROL_BURST)  # control frames the client may send now
        _sqlenv_allowance_at = 0.0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._sqlenv_allowance_at = self.loop.time()
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
                except OSError:  # not a TCP socket here (a test transport): the kernel's own size stays
                    pass

        def pause_writing(self) -> None:
            super().pause_writing()
            self._sqlenv_output_waits = True
            self.transport.pause_reading()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._sqlenv_output_waits = False
            if not self.read_paused:  # uvicorn's own pause: a message the app has not taken yet
                self.transport.resume_reading()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._sqlenv_output_waits:
                self.transport.pause_reading()  # uvicorn resumed reading as the app took a message

        def handle_ping(self) -> None:
            if self._sqlenv_control_frame():
                super().handle_ping()

        def handle_pong(self, event: Any) -> None:
            if self._sqlenv_control_frame():
                super().handle_pong(event)

        def _sqlenv_control_frame(self) -> bool:
            """Whether this control frame is within the client's allowance; past it, the connection is aborted."""
            now = self.loop.time()
            self._sqlenv_allowance = min(float(CONTROL_BURST),
                                         self._sqlenv_allowance + (now - self._sqlenv_allowance_at) * CONTROL_PER_S)
            self._sqlenv_allowance_at = now
            if self._sqlenv_allowance < 1.0:
                self.transport.abort()  # the rest of what was read goes unanswered
                return False
            self._sqlenv_allowance -= 1.0
            return True

        async def run_asgi(self) -> None:
            try:
                await super().run_asgi()
            finally:
                if not self._sqlenv_lost:
                    self._sqlenv_linger = self.loop.call_later(LINGER_S, self._sqlenv_abort)

        def connection_lost(self, exc: Any) -> None:
            self._sqlenv_lost = True
            if self._sqlenv_linger is not None:
                self._sqlenv_linger.cancel()
                self._sqlenv_linger = None
            super().connection_lost(exc)

        def _sqlenv_abort(self) -> None:
            self._sqlenv_linger = None
            if not self._sqlenv_lost:
                self.transport.abort()

    return BoundedWebSocketProtocol
