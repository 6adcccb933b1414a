"""How an HTTP server takes connections: uvicorn's HTTP/1.1 protocol with a deadline on request heads and, where
asked, bounds on the connections held per client and in all.

uvicorn bounds only the silence between two requests of a kept-alive connection (`timeout_keep_alive`): a connection
that opens and sends part of a request head, or nothing, is kept for ever. Each costs the attacker one socket and the
server one file descriptor: 400 of them were held open at once on the OpenEnv server; on the dashboard 300 were still
held at 65 s, and 20,000 filled the process's descriptors, so honest GETs were reset until the attacker let go.

- The deadline (`http_protocol`): a connection has `request_timeout_s` to complete each request head, counted from
  when the server starts waiting for it (the connection opened, or the previous response ended), and is closed when
  it has not. The head is complete when uvicorn starts a new request cycle (or hands the connection to the WebSocket
  protocol), which both parsers do as soon as they have read it.
- The head's size: at most `MAX_HEAD_BYTES`, else 431 and the connection closed. uvicorn's httptools parser keeps
  a head whole however long it grows (h11 stops at 16 KiB): one header of 140 MB sent within the deadline grew the
  server by 140 MB, and each megabyte took longer to parse than the one before.
- The bounds (`ConnectionLimits`): at most `per_client` connections from one TCP peer (`address_block`: an IPv6
  peer's /64), the next closed as soon as it is accepted; at most `total` in all, the next closing the connection
  that has waited longest for a head (one that has sent nothing useful yet; a request being served is never cut),
  or itself when none waits. So a client holds a bounded share, and a crowd of clients cannot keep a newcomer out.
  A connection upgraded to a WebSocket leaves these bounds (this protocol hears nothing more of it): the OpenEnv
  server bounds those by its session caps and its WebSocket protocol (`sqlenv.server.websocket_guard`,
  `sqlenv.server.connections.websocket_protocol`), and the dashboard's page talks over HTTP (SSE), not WebSockets.

Used by the OpenEnv server (`sqlenv.server.app.serve`: the deadline) and the dashboard (`dashboard.server.launch`: the
deadline and the bounds). No import outside the standard library but uvicorn's, inside `http_protocol`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from sqlenv.client_address import address_block

__all__ = ["MAX_HEAD_BYTES", "ConnectionLimits", "http_protocol"]

#: The largest request head read (bytes): a browser's is 1-8 KB with its cookies; nginx stops at 32 KB by default.
MAX_HEAD_BYTES = 64 * 1024
_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
                   b"content-length: 24\r\nconnection: close\r\n\r\nRequest head over 64 KiB")


class ConnectionLimits:
    """The connections one server holds at once: per client (TCP peer) and in all. One per server; used only on its
    event loop's thread (uvicorn's protocol callbacks), so it takes no lock.

    Args:
        total: most connections held at once. Keep it well below the process's descriptor limit
            (`resource.getrlimit(RLIMIT_NOFILE)`): the app's own files, databases and pipes need the rest.
        per_client: most connections from one TCP peer's `address_block` (default None: no bound per peer). Leave it
            None behind a reverse proxy, whose one address every connection then comes from.
    """

    def __init__(self, total: int, per_client: int | None = None):
        if total < 1 or (per_client is not None and per_client < 1):
            raise ValueError(f"ConnectionLimits needs total >= 1 and per_client >= 1, got {total}, {per_client}")
        self.total, self.per_client = total, per_client
        self._held: dict[Any, str] = {}  # connection -> its client
        self._per_client: dict[str, int] = {}
        self._awaiting: OrderedDict[Any, None] = OrderedDict()  # connections waiting for a head, longest first

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, connection: Any, client: str) -> bool:
        """Whether the new `connection` (a uvicorn protocol) from `client` may be held (then `release` it when it
        ends). At `total`, the connection waiting longest for a head is closed to make room (its `shutdown()`,
        which closes a connection between requests at once); False when none waits, or when `client` holds
        `per_client` already."""
        if self.per_client is not None and self._per_client.get(client, 0) >= self.per_client:
            return False
        if len(self._held) >= self.total:
            if not self._awaiting:
                return False
            oldest, _ = self._awaiting.popitem(last=False)
            self.release(oldest)
            oldest.shutdown()
        self._held[connection] = client
        self._per_client[client] = self._per_client.get(client, 0) + 1
        return True

    def awaiting_head(self, connection: Any, waiting: bool) -> None:
        """`connection` starts (True) or stops (False) waiting for a request head."""
        if not waiting:
            self._awaiting.pop(connection, None)
        elif connection in self._held:
            self._awaiting[connection] = None
            self._awaiting.move_to_end(connection)

    def release(self, connection: Any) -> None:
        """`connection` ended (no-op when it was never admitted, or already released)."""
        self._awaiting.pop(connection, None)
        client = self._held.pop(connection, None)
        if client is None:
            return
        left = self._per_client.pop(client) - 1
        if left:
            self._per_client[client] = left


def http_protocol(request_timeout_s: float, limits: ConnectionLimits | None = None) -> type:
    """uvicorn's HTTP/1.1 protocol class (httptools, else h11: the one uvicorn's "auto" picks) with a deadline on
    request heads and a bound on their size (see the module docstring), for `uvicorn.Config(http=...)`.

    Args:
        request_timeout_s: seconds a connection has to complete each request head (of at most `MAX_HEAD_BYTES`).
        limits: connections held per client and in all (default None: no bound). One `ConnectionLimits` per server:
            the class returned counts every connection it serves in it.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeadDeadlineProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _sqlenv_head_timer: asyncio.TimerHandle | None = None
        _sqlenv_waiting_after: Any = None  # the request cycle before the head awaited (None: the first)
        _sqlenv_head_bytes = 0  # received since the head was awaited

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if limits is not None:
                peer = transport.get_extra_info("peername")
                client = address_block(str(peer[0])) if isinstance(peer, tuple) and peer else "unknown"
                if not limits.admit(self, client):
                    transport.close()  # over a bound: the descriptor is free again at once
                    return
            self._sqlenv_await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._sqlenv_head_timer is None:
                return
            if self.cycle is not self._sqlenv_waiting_after:
                self._sqlenv_stop_timer()  # a head was read: uvicorn started its request cycle
                return
            self._sqlenv_head_bytes += len(data)  # all of it part of a head not yet complete
            if self._sqlenv_head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._sqlenv_stop_timer()  # (the parser holds at most one read, 256 KiB, past the bound)
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Kept alive, and no pipelined request already read: the next head is awaited from now.
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._sqlenv_await_head()

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._sqlenv_stop_timer()  # the WebSocket protocol takes the connection over
            if limits is not None:
                limits.release(self)  # and this protocol never hears of its end
            super().handle_websocket_upgrade(*args)

        def connection_lost(self, exc: Exception | None) -> None:
            self._sqlenv_stop_timer()
            if limits is not None:
                limits.release(self)
            super().connection_lost(exc)

        def _sqlenv_await_head(self) -> None:
            self._sqlenv_stop_timer()
            self._sqlenv_waiting_after = self.cycle
            self._sqlenv_head_bytes = 0
            self._sqlenv_head_timer = self.loop.call_later(request_timeout_s, self._sqlenv_head_late)
            if limits is not None:
                limits.awaiting_head(self, True)

        def _sqlenv_stop_timer(self) -> None:
            if self._sqlenv_head_timer is not None:
                self._sqlenv_head_timer.cancel()
                self._sqlenv_head_timer = None
                if limits is not None:
                    limits.awaiting_head(self, False)

        def _sqlenv_head_late(self) -> None:
            self._sqlenv_head_timer = None
            if limits is not None:
                limits.awaiting_head(self, False)
            if not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineProtocol
