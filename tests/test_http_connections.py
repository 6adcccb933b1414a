"""uvicorn's HTTP protocol with a head deadline and connection bounds (`sqlenv.http_connections`), on a real uvicorn
server on 127.0.0.1 serving a small ASGI app, with clients on other loopback addresses (127.0.0.x) as other
clients. The dashboard serves with the same protocol (tests/test_app_requests.py drives it there)."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import threading
import time

import pytest
import uvicorn

from sqlenv.http_connections import ConnectionLimits, http_protocol

HEAD_TIMEOUT_S = 2.0  # long beside closing at once, so that the two are told apart without timing
GRACE_S = 10.0  # how long a test waits for what should happen (a bound on the wait, not a timing claim)


async def _app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(1.0)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def server():
    limits = ConnectionLimits(total=8, per_client=4)
    sock = socket.create_server(("127.0.0.1", 0))
    served = uvicorn.Server(uvicorn.Config(_app, log_level="warning", http=http_protocol(HEAD_TIMEOUT_S, limits)))
    thread = threading.Thread(target=served.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield {"port": sock.getsockname()[1], "limits": limits}
    served.should_exit = True
    thread.join(10)


def _connect(port: int, source: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=GRACE_S, source_address=(source, 0))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # part of a head
    return sock


def _closed(sock: socket.socket, within_s: float = GRACE_S) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within_s`."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _closed_now(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets of `socks` the server has closed, looking until a third of the head deadline has passed with no
    more of them closing (those it closes at the deadline are still open then)."""
    closed: list[socket.socket] = []
    with selectors.DefaultSelector() as watching:  # (select() cannot watch descriptors past 1,024)
        for sock in socks:
            watching.register(sock, selectors.EVENT_READ)
        while ready := watching.select(HEAD_TIMEOUT_S / 3):
            for key, _ in ready:
                watching.unregister(key.fileobj)
                if _closed(key.fileobj, within_s=HEAD_TIMEOUT_S / 3):
                    closed.append(key.fileobj)
    return [s for s in socks if s in closed]


def _get(port: int, path: str = "/", source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=GRACE_S, source_address=(source, 0)) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


def _wait_empty(limits: ConnectionLimits) -> None:
    deadline = time.monotonic() + GRACE_S
    while len(limits) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(limits) == 0


def test_a_client_holds_at_most_its_share_and_each_head_has_a_deadline(server):
    """Issue 43, finding 6: the dashboard's uvicorn held 300 partial heads past 65 s, and 20,000 took every
    descriptor. One client (127.0.0.2) now holds at most `per_client`; the next is closed as it is accepted; the
    others are closed at the head deadline; another client is served meanwhile."""
    port, limits = server["port"], server["limits"]
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(_connect(port, "127.0.0.2")) for _ in range(7)]
        assert _get(port).endswith(b"ok")  # another client, served while they wait
        assert len(_closed_now(socks)) == 3  # 7 - per_client, closed as they were accepted
        assert all(_closed(s) for s in socks)  # the rest: at the head deadline
    _wait_empty(limits)


def test_at_the_total_the_longest_waiting_head_makes_room_and_a_request_being_served_is_never_cut(server):
    port, limits = server["port"], server["limits"]
    with contextlib.ExitStack() as stack:
        slow = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=GRACE_S))
        slow.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # a whole head: being served
        time.sleep(0.2)
        crowd = [stack.enter_context(_connect(port, f"127.0.0.{10 + i}")) for i in range(12)]  # 12 clients
        # 1 + 12 > 8: the first 5 of the crowd, the longest waiting for a head, were closed to make room.
        assert _closed_now(crowd) == crowd[:5]
        assert _get(port, source="127.0.0.3").endswith(b"ok")  # a newcomer gets in (another waiting head goes)
        reply = b""
        while chunk := slow.recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok")  # not cut
    _wait_empty(limits)


def test_a_request_head_is_bounded_in_size(server):
    """uvicorn's httptools parser kept a head whole however long it grew: 140 MB of one header, sent within the
    deadline, grew the server by 140 MB (each megabyte slower to parse than the last). Past MAX_HEAD_BYTES the
    client gets 431 and the connection is closed; a large honest head (16 KB of cookies) is served."""
    from sqlenv.http_connections import MAX_HEAD_BYTES

    port = server["port"]
    cookie = b"Cookie: " + b"c" * 16_000 + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=GRACE_S) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + cookie + b"\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok"), reply[:200]
    with socket.create_connection(("127.0.0.1", port), timeout=GRACE_S) as sock:
        # Just past the bound, then nothing: the server has read it all when it answers (input left unread would
        # make its close a reset, which can drop the answer).
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEAD_BYTES)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]  # at once: not the deadline's close without a word


def test_connection_limits_count_and_release():
    class Connection:
        shut = False

        def shutdown(self):
            self.shut = True

    limits = ConnectionLimits(total=2, per_client=1)
    a, b, c, d = Connection(), Connection(), Connection(), Connection()
    assert limits.admit(a, "x") and not limits.admit(b, "x") and limits.admit(b, "y")
    limits.awaiting_head(a, True)
    assert limits.admit(c, "z") and a.shut and len(limits) == 2  # a waited for a head: closed for c
    assert not limits.admit(d, "w")  # nobody waits for a head: the newcomer is refused
    for connection in (a, b, c, d):
        limits.release(connection)
    assert len(limits) == 0 and limits._per_client == {} and not limits._awaiting
    with pytest.raises(ValueError):
        ConnectionLimits(total=0)
