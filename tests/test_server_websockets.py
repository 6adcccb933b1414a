"""Every WebSocket the server serves is bounded, whatever route it takes and whatever its client leaves unread: a real
`python -m sqlenv serve` on 127.0.0.1, real sockets.

Issue 49: OpenEnv's `/mcp` WebSocket opened a session outside every guard (64 silent ones from one address took all
64 sessions, past the timeouts and the message bounds); a client that sent pings and never read made the server keep
every pong (500 MB of pings: +456 MB); a client that asked and never read kept its session past every timeout (the
idle clock ran only while the app waited for a message, and the close waited in `send()`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import ServerProcess, health_seconds, rss_mb  # noqa: E402

PER_CLIENT = 3
RESET_TIMEOUT_S = 4.0  # long enough to open a test's sockets on a loaded machine
GRACE_S = 5.0  # how much later than its deadline a close may come on a shared, loaded machine
# Longer than the reset deadline and its grace: the honest session, idle while the silent sockets wait out their reset
# deadline, must outlive them (at 4 s, a loaded CI closed it first); and it is the reset deadline, not this one, that
# closes a socket that never resets.
SESSION_TIMEOUT_S = RESET_TIMEOUT_S + GRACE_S + 3.0


@pytest.fixture(scope="module")
def server(builtin):
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", "8",
                        "--max-sessions-per-client", str(PER_CLIENT), "--reset-timeout", str(RESET_TIMEOUT_S),
                        "--session-timeout", str(SESSION_TIMEOUT_S)]) as proc:
        yield proc


@pytest.fixture()
def no_leak(server):
    assert server.wait_sessions(0, timeout=RESET_TIMEOUT_S + GRACE_S) == 0
    yield server
    assert server.wait_sessions(0, timeout=SESSION_TIMEOUT_S + GRACE_S) == 0, server.sessions()


def _ws(server, path: str = "/ws", source: str = "127.0.0.1", **kwargs):
    """A WebSocket to `path` whose TCP peer address is `source` (any of 127/8 reaches the server on loopback)."""
    from websockets.sync.client import connect

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
    return connect(f"ws://127.0.0.1:{server.port}{path}", sock=sock, proxy=None, compression=None, open_timeout=10,
                   **kwargs)



def test_every_websocket_route_is_guarded(no_leak):
    """OpenEnv's `/mcp` WebSocket opens a session as `/ws` does: it counts against the same per-client limit (the
    old guard looked at `/ws` only, and 64 `/mcp` sockets from one address took 64 of 64), is closed when it sends
    no reset in time, and a message of too many JSON values closes it unparsed."""
    from websockets.exceptions import ConnectionClosed

    server = no_leak
    with contextlib.ExitStack() as stack:
        # The 4,096-value bound holds on /mcp too (the old server parsed 1.1 MB messages of ~369,000 values).
        values = stack.enter_context(_ws(server, "/mcp", source="127.0.0.5"))
        values.send("[" + ",".join(["{}"] * 5000) + "]")
        with pytest.raises(ConnectionClosed) as closed:
            values.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        held = [stack.enter_context(_ws(server, "/mcp")) for _ in range(PER_CLIENT)]
        started = time.monotonic()
        for ws in held:  # a JSON-RPC call is no reset: at once, since the reset deadline runs from the connection
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}))
        assert server.wait_sessions(PER_CLIENT) == PER_CLIENT
        for path in ("/mcp", "/ws"):  # one more, on either route: refused, saying why
            extra = stack.enter_context(_ws(server, path))
            refused = json.loads(extra.recv(timeout=10))  # the old server: no message (a session, silent)
            assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED", refused
            assert "per-client" in refused["data"]["message"]
        honest = stack.enter_context(_ws(server, source="127.0.0.2"))
        honest.send(json.dumps({"type": "reset", "data": {}}))
        assert json.loads(honest.recv(timeout=30))["type"] == "observation"
        for ws in held:  # answered, then closed at the reset deadline (the answer is read now, kept till then)
            assert "does not support MCP" in ws.recv(timeout=10)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=RESET_TIMEOUT_S + GRACE_S)
            assert closed.value.rcvd is not None and "no reset within" in closed.value.rcvd.reason
        assert time.monotonic() - started <= RESET_TIMEOUT_S + GRACE_S
        assert server.wait_sessions(1) == 1  # the honest session plays on
        honest.send(json.dumps({"type": "step", "data": {"action_type": "QUERY", "argument": "SELECT 1"}}))
        assert json.loads(honest.recv(timeout=30))["type"] == "observation"


#: A client's ping frame with the longest payload a control frame may carry (masked, with a zero key).
PING = bytes([0x89, 0x80 | 125]) + bytes(4) + b"p" * 125


def _handshake(server, source: str) -> socket.socket:
    """A raw WebSocket on `/ws` from `source`, its handshake answered (101) and nothing read after it."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
    sock.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):  # byte by byte: nothing of what follows the head is read
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_a_ping_flood_from_a_client_that_never_reads_holds_little(no_leak):
    """uvicorn answers each ping with a pong written past any bound, and stopped reading only for data messages: a
    client that sent pings and never read grew the server by what it sent (500 MB: +456 MB, held). Now control
    frames have an allowance (a burst, then one a second), past which the connection is aborted, and a connection
    whose client leaves its output unread reads nothing more: the flood ends at once, and its session with it."""
    server = no_leak
    pid = server.proc.pid
    before = rss_mb(pid)
    block = PING * 8192  # ~1 MB of pings
    sock = _handshake(server, "127.0.0.3")
    sock.setblocking(False)
    sent, last_progress, started = 0, time.monotonic(), time.monotonic()
    try:
        while sent < 64 * 1024 * 1024 and time.monotonic() - started < 5.0:
            try:
                sent += sock.send(block[sent % len(block):])  # whole frames, however much each send took
                last_progress = time.monotonic()
            except BlockingIOError:
                if time.monotonic() - last_progress > 1.0:
                    break  # the server has stopped reading
                time.sleep(0.01)
            except (ConnectionResetError, BrokenPipeError):
                break  # the server ended the connection
        assert health_seconds(server, 10) < 1.0
        grown = rss_mb(pid) - before
        # The old server: all 64 MB sent within ~3 s and +60 MB; now the connection is aborted at once.
        assert sent < 32 * 1024 * 1024 and grown < 10.0, (sent, grown)
        assert server.wait_sessions(0, timeout=GRACE_S) == 0
    finally:
        sock.close()


def test_a_client_that_never_reads_is_closed_at_its_idle_timeout(no_leak):
    """A client that asks for ~30 MB of replies and reads none: the old server's idle clock ran only while the app
    waited for a message, and the app waited in `send()` for ever (with a 20 s timeout the session was open at
    60 s). A reply the client leaves unread for the idle timeout now ends the session."""
    server = no_leak
    with _ws(server, source="127.0.0.4", max_queue=1) as ws:  # the client stops reading once a reply waits
        ws.send(json.dumps({"type": "reset", "data": {}}))
        ws.send(json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "7" * 1_000_000}}))
        for _ in range(30):
            ws.send(json.dumps({"type": "state"}))  # ~1 MB each: the answer is in the transcript
        started = time.monotonic()
        assert server.wait_sessions(1) == 1
        assert server.wait_sessions(0, timeout=SESSION_TIMEOUT_S + GRACE_S) == 0
        assert time.monotonic() - started <= SESSION_TIMEOUT_S + GRACE_S
        ws.close_socket()
