"""How the server takes connections: its listening sockets (uvicorn's HTTP protocol with a deadline on request
heads is `sqlenv.http_connections.http_protocol`, which the dashboard uses too).

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

import socket

__all__ = ["LISTENERS", "listening_sockets"]

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
