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
from collections import deque
from typing import Any

__all__ = ["LISTENERS", "LINGER_S", "SEND_BUFFER_BYTES", "CONTROL_BURST", "CONTROL_PER_S", "FRAME_BURST", "FRAME_PER_S",
           "BYTE_BURST", "BYTE_PER_S", "MAX_FRAGMENTS", "FrameAllowance", "listening_sockets", "websocket_protocol"]

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
#: pings every 20 s or so (OpenEnv's and `websockets`' clients), a browser never. uvicorn answers each at once with a
#: pong written past any bound, so they have a tighter allowance than other frames.
CONTROL_BURST, CONTROL_PER_S = 32, 1.0
#: Frames of any kind (data, continuation, control) a client may send at once, and per second after that, beside
#: the messages the app has taken. Each frame costs the event loop ~2-4 us to parse, whether or not it completes a
#: message, and uvicorn keeps every fragment of a message until its last (issue 59: 8 million empty continuation
#: frames in 20 s held the loop 17-19 s of 20 and +65-70 MB). A message the app takes gives its last frame back:
#: the app paces messages (uvicorn reads no further until it takes one), so a client stepping as fast as the server
#: answers (~1,900 steps a second on one connection here) spends nothing, while frames that complete no message
#: (continuations, pings) and messages sent ahead of the app are what the allowance bounds.
FRAME_BURST, FRAME_PER_S = 1024, 256.0
#: Bytes a client may send at once, and per second after that, each frame counted at its payload plus
#: `FRAME_COST_BYTES` (its header and the work of parsing it); a message the app takes gives its payload back.
#: Two of the largest messages at once (`sqlenv.server.app.WS_MAX_MESSAGE_BYTES`), one a second.
BYTE_BURST, BYTE_PER_S = 2 * (1024 * 1024 + 64 * 1024), float(1024 * 1024 + 64 * 1024)
FRAME_COST_BYTES = 16
#: Frames one message may be sent in: a message costs what its frames cost, and uvicorn keeps each fragment (a 1 MB
#: message in 1-byte fragments was a million objects, ~40 MB). 1,024 fragments carry the largest message in pieces
#: of 1 KiB; clients send a message in one frame (browsers, OpenEnv's and `websockets`' clients).
MAX_FRAGMENTS = 1024
#: Bytes handed to the frame parser at a time: past the allowance the connection is aborted after at most this much
#: more of what was read was parsed (a read can be 256 KiB: ~40,000 empty frames).
PARSE_CHUNK_BYTES = 4096


class _Bucket:
    """A token bucket: `burst` at once, `per_s` a second after that."""

    __slots__ = ("burst", "per_s", "left", "at")

    def __init__(self, burst: float, per_s: float, now: float):
        self.burst, self.per_s, self.left, self.at = float(burst), float(per_s), float(burst), now

    def take(self, cost: float, now: float) -> bool:
        self.left = min(self.burst, self.left + (now - self.at) * self.per_s)
        self.at = now
        if self.left < cost:
            return False
        self.left -= cost
        return True

    def give_back(self, cost: float) -> None:
        self.left = min(self.burst, self.left + cost)


class FrameAllowance:
    """What one WebSocket client may send: every frame is charged here before it is handled (`charge`), and a
    message the app takes gives back its last frame and its payload (`taken`).

    - frames: `FRAME_BURST` at once, `FRAME_PER_S` a second after that, whatever their kind;
    - bytes: `BYTE_BURST` at once, `BYTE_PER_S` a second after that, each frame its payload plus `FRAME_COST_BYTES`;
    - control frames (pings, pongs) also `CONTROL_BURST` at once, `CONTROL_PER_S` a second;
    - a message in at most `MAX_FRAGMENTS` frames.
    """

    def __init__(self, now: float):
        self.frames = _Bucket(FRAME_BURST, FRAME_PER_S, now)
        self.bytes = _Bucket(BYTE_BURST, BYTE_PER_S, now)
        self.control = _Bucket(CONTROL_BURST, CONTROL_PER_S, now)
        self.fragments = 0  # frames of the message under way (0: none)
        self.message_bytes = 0  # its payload so far
        self.untaken: deque[int] = deque()  # the payloads of messages complete and not yet taken by the app

    def charge(self, opcode: int, fin: bool, size: int, now: float) -> str | None:
        """Charge one frame (its opcode, FIN bit, payload size); None when within the allowance, else why not."""
        if not self.frames.take(1.0, now):
            return f"more than {FRAME_BURST} frames at once or {FRAME_PER_S:g} a second"
        if not self.bytes.take(size + FRAME_COST_BYTES, now):
            return f"more than {BYTE_BURST} bytes at once or {BYTE_PER_S:g} a second"
        if opcode >= 0x8:  # control frames: close, ping, pong
            if opcode != 0x8 and not self.control.take(1.0, now):
                return f"more than {CONTROL_BURST} pings and pongs at once or {CONTROL_PER_S:g} a second"
            return None
        if opcode == 0x0:  # a continuation
            self.fragments += 1
            self.message_bytes += size
        else:  # a message's first frame
            self.fragments, self.message_bytes = 1, size
        if self.fragments > MAX_FRAGMENTS:
            return f"a message in more than {MAX_FRAGMENTS} frames"
        if fin:
            self.untaken.append(self.message_bytes)
            self.fragments, self.message_bytes = 0, 0
        return None

    def taken(self) -> None:
        """The app took a message: its last frame and its payload are given back (the app paced them)."""
        if self.untaken:
            self.frames.give_back(1.0)
            self.bytes.give_back(self.untaken.popleft())


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
    - Every frame has an allowance (`FrameAllowance`): frames and bytes at once and per second, pings and pongs
      tighter (`CONTROL_BURST` at once, `CONTROL_PER_S` a second), a message in at most `MAX_FRAGMENTS` frames;
      past it the connection is aborted. Complete messages are paced by the app (uvicorn reads the next once the
      app took the last), but nothing paced the frames that complete none: four clients' ping floods held
      `/health` 1.3-2.8 s at load 7 (issue 49), and one client's empty continuation frames after an unfinished
      message, 6 bytes each, held it 7.8-10.4 s (issue 59: the message bound counts payload bytes, which stayed at
      1). What was read is parsed `PARSE_CHUNK_BYTES` at a time, so an aborted connection's flood is not parsed
      past that.
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

        _sqlenv_allowance: FrameAllowance
        _sqlenv_over = False  # past the allowance: the connection is aborted, what is left of the read unhandled

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._sqlenv_allowance = FrameAllowance(self.loop.time())
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
            view = memoryview(data)
            for start in range(0, len(data), PARSE_CHUNK_BYTES):  # stop parsing once the client is past its allowance
                if self._sqlenv_over or (start and self.transport.is_closing()):  # (or uvicorn closed it: a bad frame)
                    return
                super().data_received(bytes(view[start:start + PARSE_CHUNK_BYTES]) if len(data) > PARSE_CHUNK_BYTES
                                      else data)
            if self._sqlenv_output_waits:
                self.transport.pause_reading()  # uvicorn resumed reading as the app took a message

        async def receive(self) -> Any:
            message = await super().receive()
            if message["type"] == "websocket.receive":
                self._sqlenv_allowance.taken()
            return message

        def handle_text(self, event: Any) -> None:
            if self._sqlenv_frame(event):
                super().handle_text(event)

        def handle_bytes(self, event: Any) -> None:
            if self._sqlenv_frame(event):
                super().handle_bytes(event)

        def handle_cont(self, event: Any) -> None:
            if self._sqlenv_frame(event):
                super().handle_cont(event)

        def handle_ping(self) -> None:
            if self._sqlenv_frame(None):
                super().handle_ping()

        def handle_pong(self, event: Any) -> None:
            if self._sqlenv_frame(event):
                super().handle_pong(event)

        def _sqlenv_frame(self, event: Any) -> bool:
            """Whether this frame (None: a ping, which uvicorn's handler is not given) is within the client's
            allowance; past it, the connection is aborted and the rest of what was read goes unhandled."""
            if self._sqlenv_over:
                return False
            if event is None:
                opcode, fin, size = 0x9, True, 0  # a ping's payload is at most 125 bytes: its frame cost covers it
            else:
                opcode, fin, size = int(event.opcode), bool(event.fin), len(event.data)
            if self._sqlenv_allowance.charge(opcode, fin, size, self.loop.time()) is None:
                return True
            self._sqlenv_over = True
            self.transport.abort()
            return False

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
