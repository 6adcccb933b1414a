"""Server sessions and connections cannot be used up: a real `python -m sqlenv serve` on 127.0.0.1.

Issue 20: sixteen `POST /mcp` calls of `openenv/session/create` once held every slot of a 16-session server for
good (no connection owned them and nothing expired them). Issue 26: the guard then looked for those bytes, so
`openenv\\/session\\/create` went through; OpenEnv's idle reaper freed a session but its WebSocket went on
playing (12 working sessions on a 4-session server); half-sent requests held connections for ever. Now a
session comes only with a WebSocket and ends with it, a silent WebSocket is closed after `--session-timeout`,
session creation is refused however it is spelled, a connection has `--request-timeout` to send a request head
(and a body), and HTTP bodies are bounded.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import ServerProcess  # noqa: E402

MAX_SESSIONS = 3
TIMEOUT_S = 3.0  # a WebSocket silent this long is closed (with margin for a loaded machine between two calls)
REQUEST_TIMEOUT_S = 1.0  # a connection's time to send a request head, and a POST body
GRACE_S = 5.0  # how much later than its deadline a close may come on a shared, loaded machine


@pytest.fixture(scope="module")
def server(builtin):
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", str(MAX_SESSIONS),
                        "--session-timeout", str(TIMEOUT_S), "--request-timeout", str(REQUEST_TIMEOUT_S)]) as proc:
        yield proc


def _post(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _ws(server):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{server.port}/ws", proxy=None, compression=None, open_timeout=10)


def _reset(ws) -> dict:
    ws.send(json.dumps({"type": "reset", "data": {}}))
    return json.loads(ws.recv(timeout=30))


def test_http_session_creation_cannot_fill_the_server(server):
    create = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}).encode()
    for _ in range(MAX_SESSIONS * 3):
        status, reply = _post(server.url + "/mcp", create)
        assert status == 200 and "error" in reply and "/ws" in reply["error"]["message"], reply
    assert server.sessions() == {"open": 0, "max": MAX_SESSIONS}
    with contextlib.ExitStack() as stack:  # every slot is still there for WebSocket clients
        clients = [stack.enter_context(_ws(server)) for _ in range(MAX_SESSIONS)]
        assert all(_reset(ws)["type"] == "observation" for ws in clients)
        assert server.sessions()["open"] == MAX_SESSIONS
    assert server.wait_sessions(0) == 0


# The bodies that once opened sessions past the byte-pattern guard, and the other spellings OpenEnv reads the
# same way (it parses with `json.loads` of the bytes): JSON escapes, UTF-16, repeated keys, a batch.
CREATE_SPELLINGS = {
    "escaped slashes": b'{"jsonrpc":"2.0","id":1,"method":"openenv\\/session\\/create","params":{}}',
    "unicode escape": b'{"jsonrpc":"2.0","id":1,"method":"openenv/session/\\u0063reate","params":{}}',
    "utf-16 body": json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
                               "params": {}}).encode("utf-16"),
    "repeated key": b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{},"method":"openenv/session/create"}',
    "batch": json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                         {"jsonrpc": "2.0", "id": 2, "method": "openenv/session/create", "params": {}}]).encode(),
}


@pytest.mark.parametrize("spelling", sorted(CREATE_SPELLINGS))
def test_session_creation_is_refused_however_it_is_spelled(server, spelling):
    """Judged on the parsed request: the old guard looked for the bytes `openenv/session/create`, and the
    escaped spellings went through (62 requests took all 64 sessions of a server in 0.06 s)."""
    assert server.wait_sessions(0) == 0
    for _ in range(MAX_SESSIONS + 1):
        status, reply = _post(server.url + "/mcp", CREATE_SPELLINGS[spelling])
        assert status == 200 and "result" not in reply, reply
        assert "/ws" in reply["error"]["message"], reply
    assert server.sessions() == {"open": 0, "max": MAX_SESSIONS}


def test_an_idle_session_is_closed_after_the_timeout(server):
    with _ws(server) as ws:
        assert _reset(ws)["type"] == "observation"
        assert server.sessions()["open"] == 1
        # Silent past the timeout: the server closes the connection and the session with it.
        assert server.wait_sessions(0, timeout=TIMEOUT_S + GRACE_S) == 0
    assert server.wait_sessions(0) == 0


def test_a_session_closed_for_silence_is_closed_for_its_websocket(server):
    """Issue 26: OpenEnv's reaper freed an idle session but left its WebSocket playing on a closed environment,
    outside the session limit. Now the server closes the WebSocket itself (a close frame saying why), so the
    old connection can neither reset nor step, and the freed slots serve new clients."""
    from websockets.exceptions import ConnectionClosed

    assert server.wait_sessions(0) == 0
    with contextlib.ExitStack() as stack:
        first = [stack.enter_context(_ws(server)) for _ in range(MAX_SESSIONS)]
        assert all(_reset(ws)["type"] == "observation" for ws in first)
        assert server.sessions()["open"] == MAX_SESSIONS
        started = time.monotonic()
        for ws in first:
            with pytest.raises(ConnectionClosed) as closed:  # on the old server: TimeoutError, no close came
                ws.recv(timeout=TIMEOUT_S + GRACE_S)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
            assert "no message for" in closed.value.rcvd.reason and "connect again" in closed.value.rcvd.reason
        assert TIMEOUT_S - 0.5 <= time.monotonic() - started <= TIMEOUT_S + GRACE_S
        assert server.wait_sessions(0) == 0
        for ws in first:
            with pytest.raises(ConnectionClosed):
                _reset(ws)
        second = [stack.enter_context(_ws(server)) for _ in range(MAX_SESSIONS)]
        assert all(_reset(ws)["type"] == "observation" for ws in second)
        assert server.sessions()["open"] == MAX_SESSIONS  # never more sessions at work than the limit
    assert server.wait_sessions(0) == 0


def test_a_remote_environment_starts_over_after_an_idle_close(server, questions):
    """What a trainer paused past the timeout sees: the episode ends with an error observation (`done`,
    `truncated`), and the next reset opens a new session that plays."""
    from sqlenv.server.remote import RemoteSQLEnvironment
    from sqlenv.types import SQLAction

    q = questions[0]
    with RemoteSQLEnvironment(server.url, questions=questions) as remote:
        remote.reset(question_id=q.question_id)
        assert server.wait_sessions(0, timeout=TIMEOUT_S + GRACE_S) == 0  # closed for silence
        lost = remote.step(SQLAction("QUERY", q.gold_sql))
        assert lost.done and lost.truncated and "Lost the connection" in lost.error, lost
        assert remote.reset(question_id=q.question_id).question == q.question_text
        assert remote.step(SQLAction("QUERY", q.gold_sql)).error == ""
    assert server.wait_sessions(0) == 0


def test_a_websocket_in_use_outlives_both_timeouts(server):
    """The request-head deadline ends with the WebSocket handshake, and every message restarts the silence
    clock: a session quiet for longer than `--request-timeout` each time, and in use for longer than
    `--session-timeout` in all, keeps playing."""
    with _ws(server) as ws:
        started = time.monotonic()
        assert _reset(ws)["type"] == "observation"
        while time.monotonic() - started < TIMEOUT_S + 1.0:
            time.sleep(REQUEST_TIMEOUT_S + 0.5)
            assert _reset(ws)["type"] == "observation"
        assert server.sessions()["open"] == 1
    assert server.wait_sessions(0) == 0


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed `sock` within `seconds`, what it sent before closing)."""
    sock.settimeout(seconds)
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, received
            received += chunk
    except (ConnectionResetError, BrokenPipeError):
        return True, received
    except TimeoutError:
        return False, received


def test_a_connection_must_send_its_request_head_in_time(server):
    """Issue 26: uvicorn bounds only the silence between two kept-alive requests, so a connection that sent part
    of a request head (or nothing) was held for ever: 400 of them were held at once. Now each must complete its
    head within `--request-timeout`, counted from when it opened or its previous response ended."""
    port = server.port
    with contextlib.ExitStack() as stack:
        half_open = [stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
                     for _ in range(50)]
        for i, sock in enumerate(half_open):
            if i % 2:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # part of a head
        # Kept alive after a full request, then part of the next head.
        kept = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        response = b""
        while b'"healthy"' not in response:  # the whole response (head and body may come apart)
            chunk = kept.recv(65536)
            assert chunk, response
            response += chunk
        assert response.startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /health HTTP/1.1\r\n")
        started = time.monotonic()
        with urllib.request.urlopen(server.url + "/health", timeout=10) as response:  # others are served meanwhile
            assert json.loads(response.read())["status"] == "healthy"
        for sock in [*half_open, kept]:
            closed, received = _closed_within(sock, REQUEST_TIMEOUT_S + GRACE_S)
            assert closed and received == b"", (closed, received[:200])
        assert time.monotonic() - started <= REQUEST_TIMEOUT_S + GRACE_S


def test_a_request_body_must_arrive_in_time(server):
    """The same for a POST body: a declared body not sent gets 408 and the connection is closed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"action\": ")
        closed, received = _closed_within(sock, REQUEST_TIMEOUT_S + GRACE_S)
    assert closed and received.startswith(b"HTTP/1.1 408"), received[:300]
    assert b"request body not received" in received


def test_http_bodies_are_bounded(server):
    from sqlenv.server.app import MAX_HTTP_BODY_BYTES

    try:  # the server answers 413 from the Content-Length header and may close before the body is sent
        status, _ = _post(server.url + "/step", b"{" + b" " * (MAX_HTTP_BODY_BYTES + 1) + b"}")
    except urllib.error.URLError as err:
        assert isinstance(err.reason, (BrokenPipeError, ConnectionResetError)), err
    else:
        assert status == 413
    status, reply = _post(server.url + "/mcp", json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list",
                                                            "params": {}}).encode())
    assert status == 200 and reply["id"] == 7  # other JSON-RPC calls reach OpenEnv as before
    with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
        assert json.loads(response.read())["status"] == "healthy"


# ------------------------------------------------------------------------------------ issue 35, finding 5
PER_CLIENT = 3
RESET_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def guarded(builtin):
    """A server with room for every test client but PER_CLIENT sessions per address, and a short reset deadline
    (the idle timeout stays long, so any close within it is the reset deadline's)."""
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", "8",
                        "--max-sessions-per-client", str(PER_CLIENT), "--reset-timeout", str(RESET_TIMEOUT_S),
                        "--session-timeout", "120"]) as proc:
        yield proc


def _ws_from(server, source: str):
    """A WebSocket whose TCP peer address is `source` (any of 127/8 reaches the server on loopback)."""
    from websockets.sync.client import connect

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
    return connect(f"ws://127.0.0.1:{server.port}/ws", sock=sock, proxy=None, compression=None, open_timeout=10)


def test_one_client_address_cannot_take_every_session(guarded):
    """64 sockets from one client that never sent a message took 64 of 64 slots, and honest clients got
    CAPACITY_REACHED. Now one address holds at most --max-sessions-per-client; others still get sessions."""
    from websockets.exceptions import ConnectionClosed

    assert guarded.wait_sessions(0) == 0
    with contextlib.ExitStack() as stack:
        idle = [stack.enter_context(_ws_from(guarded, "127.0.0.1")) for _ in range(PER_CLIENT)]
        assert guarded.wait_sessions(PER_CLIENT) == PER_CLIENT
        # A forged X-Forwarded-For from a loopback peer names no other client.
        from websockets.sync.client import connect

        extra = stack.enter_context(connect(f"ws://127.0.0.1:{guarded.port}/ws", proxy=None, compression=None,
                                            additional_headers={"X-Forwarded-For": "203.0.113.7"}))
        refused = json.loads(extra.recv(timeout=10))
        assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED", refused
        assert "per-client" in refused["data"]["message"]
        with pytest.raises(ConnectionClosed):
            _reset(extra)
        # A handshake to another path is no session: refused as at rest (403), not accepted to be told why.
        from websockets.exceptions import InvalidStatus

        with pytest.raises(InvalidStatus, match="403"):
            connect(f"ws://127.0.0.1:{guarded.port}/ws/ui", proxy=None, compression=None, open_timeout=10)
        honest = stack.enter_context(_ws_from(guarded, "127.0.0.2"))
        assert _reset(honest)["type"] == "observation"
        assert guarded.sessions()["open"] == PER_CLIENT + 1
        for ws in idle:
            ws.close()
        again = stack.enter_context(_ws_from(guarded, "127.0.0.1"))  # a slot freed is the client's again
        assert _reset(again)["type"] == "observation"
    assert guarded.wait_sessions(0) == 0


def test_a_websocket_that_never_resets_is_closed(guarded):
    """A socket that connects and never resets (silent, or sending only `state`) used to keep its slot for the
    600 s idle timeout, renewed by each message. Now it is closed --reset-timeout after it connected; one that
    reset plays on."""
    from websockets.exceptions import ConnectionClosed

    assert guarded.wait_sessions(0) == 0
    with _ws(guarded) as silent, _ws(guarded) as chatty, _ws(guarded) as player:
        assert _reset(player)["type"] == "observation"
        started = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            silent.recv(timeout=RESET_TIMEOUT_S + GRACE_S)
        assert closed.value.rcvd is not None and "no reset within" in closed.value.rcvd.reason
        assert RESET_TIMEOUT_S - 0.5 <= time.monotonic() - started <= RESET_TIMEOUT_S + GRACE_S
        with pytest.raises(ConnectionClosed):
            while time.monotonic() - started < RESET_TIMEOUT_S + GRACE_S:
                chatty.send(json.dumps({"type": "state"}))
                chatty.recv(timeout=5)
                time.sleep(0.3)
        assert guarded.wait_sessions(1) == 1
        step = {"type": "step", "data": {"action_type": "QUERY", "argument": "SELECT 1"}}
        player.send(json.dumps(step))
        assert json.loads(player.recv(timeout=30))["type"] == "observation"
    assert guarded.wait_sessions(0) == 0


def test_a_few_client_addresses_cannot_take_every_session(guarded):
    """Issue 49: four addresses of 16 silent sessions each took 64 of 64 (each within its per-client limit), and
    honest clients were refused. A client that holds sessions gets one more only while more than it holds are
    free: the addresses that would fill the server (here 3 x 3 of 8) leave room, and a newcomer plays."""
    from websockets.exceptions import ConnectionClosed

    assert guarded.wait_sessions(0) == 0
    with contextlib.ExitStack() as stack:
        held: dict[str, int] = {}
        for source in ("127.0.0.11", "127.0.0.12", "127.0.0.13"):
            held[source] = 0
            for _ in range(PER_CLIENT):
                ws = stack.enter_context(_ws_from(guarded, source))
                with contextlib.suppress(ConnectionClosed):  # a refusal may have closed it already
                    ws.send(json.dumps({"type": "reset", "data": {}}))
                reply = json.loads(ws.recv(timeout=30))
                if reply["type"] != "observation":
                    assert reply["data"]["code"] == "CAPACITY_REACHED" and "free" in reply["data"]["message"]
                    break
                held[source] += 1
        assert list(held.values()) == [PER_CLIENT, PER_CLIENT, 1]  # the old server: 3, 3 and 2, 8 of 8
        honest = stack.enter_context(_ws_from(guarded, "127.0.0.14"))
        assert _reset(honest)["type"] == "observation"
        step = {"type": "step", "data": {"action_type": "QUERY", "argument": "SELECT 1"}}
        honest.send(json.dumps(step))
        assert json.loads(honest.recv(timeout=30))["type"] == "observation"
        assert guarded.sessions()["open"] == 2 * PER_CLIENT + 2
    assert guarded.wait_sessions(0) == 0


# ------------------------------------------------------------ behind a reverse proxy (a Space): SQLENV_PROXY_HOPS
@pytest.fixture(scope="module")
def proxied(builtin):
    """A server started as the Dockerfile starts it on a Space: no proxy setting, and the Space's own environment
    (`SPACE_ID`, `SYSTEM=spaces`), which says its proxy is in front: one hop trusted."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPACE_ID", "someone/sqlenv")
        env.setenv("SYSTEM", "spaces")
        env.delenv("SQLENV_PROXY_HOPS", raising=False)
        env.delenv("FORWARDED_ALLOW_IPS", raising=False)
        with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", "8",
                            "--max-sessions-per-client", str(PER_CLIENT), "--session-timeout", "120"]) as proc:
            yield proc


def _ws_forwarded(server, forwarded: str | list[str]):
    """A WebSocket from 127.0.0.1 (the proxy's address here) carrying `X-Forwarded-For` (a list: one header line
    each, as a proxy that adds its own line rather than appending sends it)."""
    from websockets.sync.client import connect

    lines = [forwarded] if isinstance(forwarded, str) else forwarded
    return connect(f"ws://127.0.0.1:{server.port}/ws", proxy=None, compression=None, open_timeout=10,
                   additional_headers=[("X-Forwarded-For", line) for line in lines])


def _refused(ws) -> bool:
    reply = json.loads(ws.recv(timeout=10))
    return reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"


def test_behind_a_proxy_each_client_has_its_own_limit_keyed_by_the_entry_the_proxy_appended(proxied):
    """On a Space every client arrives from the proxy's address, so the per-client limit was one limit for all
    clients together. With one trusted hop a client is the X-Forwarded-For entry the proxy appended (the last
    one): clients with different last entries have separate limits, and entries a client writes to the left of
    the proxy's (its own claims, a new one per connection) name no new client."""
    assert proxied.wait_sessions(0) == 0
    client = "198.51.100.1"  # the address the proxy saw and appended
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(_ws_forwarded(proxied, f"203.0.113.{i}, 10.9.9.{i}, {client}"))
                for i in range(PER_CLIENT)]  # a new forged prefix on each connection
        assert all(_reset(ws)["type"] == "observation" for ws in held)
        forged = stack.enter_context(_ws_forwarded(proxied, f"203.0.113.99, {client}"))
        assert _refused(forged)
        # The proxy adding a header line of its own after the client's: the same list, the same client.
        second_line = stack.enter_context(_ws_forwarded(proxied, ["203.0.113.100", client]))
        assert _refused(second_line)
        other = stack.enter_context(_ws_forwarded(proxied, f"{client}, 198.51.100.2"))  # another client
        assert _reset(other)["type"] == "observation"
        direct = stack.enter_context(_ws_from(proxied, "127.0.0.1"))  # no header: the peer is the client
        assert _reset(direct)["type"] == "observation"
        assert proxied.sessions()["open"] == PER_CLIENT + 2
    assert proxied.wait_sessions(0) == 0


@pytest.mark.parametrize("args, env, expected", [
    (["--proxy-hops", "-1"], {}, "--proxy-hops"),
    ([], {"SQLENV_PROXY_HOPS": "two"}, "SQLENV_PROXY_HOPS must be a non-negative integer"),
    ([], {"SQLENV_PROXY_HOPS": "1", "FORWARDED_ALLOW_IPS": "10.0.0.5"},
     "SQLENV_PROXY_HOPS and FORWARDED_ALLOW_IPS both"),
    (["--proxy-hops", "1"], {"FORWARDED_ALLOW_IPS": "*"}, "--proxy-hops and FORWARDED_ALLOW_IPS both"),
])
def test_one_proxy_setting_or_a_one_line_refusal(args, env, expected):
    """Proxy hops and uvicorn's FORWARDED_ALLOW_IPS both say which proxies to trust, and could disagree: the
    server refuses to start with both (as the dashboard does), and with a bad hop count, in one line, exit 2."""
    import os
    import subprocess
    import sys

    from serverproc import REPO

    clean = {k: v for k, v in os.environ.items() if k not in ("SQLENV_PROXY_HOPS", "FORWARDED_ALLOW_IPS")}
    done = subprocess.run([sys.executable, "-m", "sqlenv", "serve", "--port", "1", *args], cwd=REPO,
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and expected in lines[0], done.stderr[-1000:]
