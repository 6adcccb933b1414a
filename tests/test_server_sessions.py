"""Server sessions cannot be used up (issue 20, finding 1): a real `python -m sqlenv serve` on 127.0.0.1.

Sixteen `POST /mcp` calls of `openenv/session/create` once held every slot of a 16-session server for good (no
connection owned them and nothing expired them). Now sessions come only with a WebSocket, idle ones are closed
after `--session-timeout`, and HTTP bodies are bounded.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import ServerProcess  # noqa: E402

MAX_SESSIONS = 3
TIMEOUT_S = 1.0  # OpenEnv's reaper looks every max(timeout / 4, 5 s)


@pytest.fixture(scope="module")
def server(builtin):
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", str(MAX_SESSIONS),
                        "--session-timeout", str(TIMEOUT_S)]) as proc:
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


def test_an_idle_session_is_closed_after_the_timeout(server):
    with _ws(server) as ws:
        assert _reset(ws)["type"] == "observation"
        assert server.sessions()["open"] == 1
        # Silent past the timeout: the reaper (every 5 s at most) closes the session and frees its slot.
        assert server.wait_sessions(0, timeout=20) == 0
    assert server.wait_sessions(0) == 0


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
