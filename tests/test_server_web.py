"""The server a Space runs: the Dockerfile's CMD (`--web`) on 127.0.0.1, its page, and the largest messages.

Issue 43, findings 3-5: OpenEnv's web interface (one episode shared by every visitor at `/web/reset` and `/web/step`,
pushes to `/ws/ui`, a Gradio app at `/web`) hung every step behind one UI socket that never read, kept 1,000 steps'
arguments, and took uploads and Gradio sessions from anyone. `--web` now serves SQLEnv's own static page, which plays
over `/ws` like any client, and none of OpenEnv's web routes. Finding 7: a 16 MiB WebSocket message of `{}`s was
read whole and parsed on the event loop (+0.8 GB, `/health` 2 s); now a message is at most `WS_MAX_MESSAGE_BYTES`
(refused unread) and holds at most `MAX_JSON_VALUES` values (refused unparsed), and so is an HTTP body.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
import uuid

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import REPO, ServerProcess, get_json  # noqa: E402

from sqlenv.evaluation.evaluate import play_episode  # noqa: E402
from sqlenv.evaluation.policies import OraclePolicy  # noqa: E402

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def space(builtin, tmp_path_factory):
    """The Dockerfile's CMD (host and port swapped for a free local one), with Gradio's temp folder set to one of
    the test's own, to see that nothing lands there."""
    cmd_line = next(line for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    command = json.loads(cmd_line[4:])
    assert command[:3] == ["python", "-m", "sqlenv"] and "--web" in command
    command[0] = sys.executable
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = "{port}"
    temp = tmp_path_factory.mktemp("gradio-temp")
    with pytest.MonkeyPatch.context() as env:  # read when the server starts
        env.setenv("GRADIO_TEMP_DIR", str(temp))
        proc = ServerProcess(command=command).start()
    proc.gradio_temp = temp
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture()
def no_leak(space):
    """The server holds as many sessions after the test as before it (none, unless a test before this one left
    one: then that one's check failed)."""
    before = space.sessions()["open"]
    yield space
    assert space.wait_sessions(before) == before, space.sessions()


def _http(url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _ws(server, path: str = "/ws", **kwargs):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{server.port}{path}", proxy=None, compression=None, open_timeout=10,
                   max_size=None, **kwargs)


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _objects(count: int) -> str:
    """A step message whose argument is a list of `count` empty objects (three bytes each)."""
    return '{"type": "step", "data": {"action_type": "QUERY", "argument": [' + ",".join(["{}"] * count) + "]}}"


# ------------------------------------------------------------------------------ the page

def test_the_docker_command_serves_the_page_which_holds_no_session(no_leak):
    assert get_json(no_leak.url + "/metadata")["name"] == "sqlenv"
    for path in ("/", "/web", "/web/"):  # the root and /web redirect to the page, as OpenEnv's did
        with urllib.request.urlopen(no_leak.url + path, timeout=30) as page:
            assert page.url == no_leak.url + "/web/"
            html = page.read().decode()
            policy = page.headers["Content-Security-Policy"]
    assert "<html" in html and "SQLEnv" in html and 'new URL("../ws", location.href)' in html
    assert "script-src 'sha256-" in policy and "connect-src 'self'" in policy and "default-src 'none'" in policy
    assert no_leak.sessions()["open"] == 0  # OpenEnv's page held one shared environment for every visitor


def test_openenv_web_interface_routes_are_not_served(no_leak):
    """Each shape of findings 3-5 on the routes OpenEnv's web interface served: none of them is there."""
    from websockets.exceptions import InvalidStatus

    # 3: a UI socket that never reads (OpenEnv accepted it, then awaited it inside every /web/reset and /web/step).
    with pytest.raises(InvalidStatus):
        with _ws(no_leak, "/ws/ui"):
            pass
    # 4: 1 MB arguments to the shared episode (OpenEnv logged the last 1,000 of them).
    step = json.dumps({"action": {"action_type": "QUERY", "argument": "x" * 1_000_000}}).encode()
    for _ in range(3):
        assert _http(no_leak.url + "/web/step", step)[0] == 404
    assert _http(no_leak.url + "/web/reset", b"{}")[0] == 404
    for path in ("/web/state", "/web/metadata"):
        assert _http(no_leak.url + path)[0] == 404
    # 5: uploads (Gradio kept them in its temp folder and served them back) and Gradio's event routes.
    boundary = uuid.uuid4().hex
    upload = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.txt\"\r\n"
              f"Content-Type: text/plain\r\n\r\n").encode() + b"x" * 900_000 + f"\r\n--{boundary}--\r\n".encode()
    status, _, _ = _http(no_leak.url + "/web/gradio_api/upload", upload,
                         {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 404
    join = json.dumps({"data": ["x" * 900_000], "fn_index": 1, "session_hash": "s1"}).encode()
    assert _http(no_leak.url + "/web/gradio_api/queue/join", join)[0] == 404
    assert list(no_leak.gradio_temp.rglob("*")) == []


# ------------------------------------------------------------------------------ the largest messages

def test_the_longest_answer_fits_in_a_message(no_leak, questions):
    from sqlenv.scoring.verifier import MAX_ANSWER_CHARS
    from sqlenv.server.app import WS_MAX_MESSAGE_BYTES

    message = json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "7" * MAX_ANSWER_CHARS}})
    assert len(message) <= WS_MAX_MESSAGE_BYTES < 2 * MIB
    with _ws(no_leak) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"question_id": questions[0].question_id}}))
        ws.recv(timeout=30)
        ws.send(message)
        reply = json.loads(ws.recv(timeout=60))
    assert reply["type"] == "observation" and reply["data"]["done"] is True


def test_a_message_of_many_small_values_closes_only_its_connection(no_leak, questions):
    """A 1 MiB message of `{}`s (350,000 objects, under the size limit) is refused before it is parsed: its
    connection is closed (1009, saying why), an honest session plays on, and an HTTP body of them gets 413."""
    from websockets.exceptions import ConnectionClosed

    from sqlenv.server.json_values import MAX_JSON_VALUES
    from sqlenv.server.remote import RemoteSQLEnvironment

    question = questions[1].question_id
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as honest:
        honest.reset(question_id=question)
        with _ws(no_leak) as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            ws.recv(timeout=30)
            ws.send(_objects(MIB // 3 - 30))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
        assert closed.value.rcvd.code == 1009 and str(MAX_JSON_VALUES) in closed.value.rcvd.reason
        status, _, body = _http(no_leak.url + "/step", _objects(MIB // 3 - 30).encode())
        assert status == 413 and b"JSON values" in body
        assert play_episode(honest, OraclePolicy(), question_id=question)["outcome"] == "correct"


def test_a_16_mib_message_is_refused_unread(no_leak, questions):
    """The issue's message: 16 MiB of `{}`s on each of four connections. Each is closed (1009) without the server
    reading the message (it grew by 0.8 GB per message), and an honest session plays on."""
    from websockets.exceptions import ConnectionClosed

    from sqlenv.server.remote import RemoteSQLEnvironment

    before = _rss_mb(no_leak.proc.pid)
    message = "[" + ",".join(["{}"] * (16 * MIB // 3)) + "]"
    with RemoteSQLEnvironment(no_leak.url, questions=questions) as honest:
        for _ in range(4):
            with _ws(no_leak) as ws:
                ws.send(json.dumps({"type": "reset", "data": {}}))
                ws.recv(timeout=30)
                with pytest.raises(ConnectionClosed) as closed:
                    ws.send(message)  # the server may close while the frame is still going out
                    ws.recv(timeout=30)
            assert closed.value.rcvd is None or closed.value.rcvd.code == 1009
        grown = _rss_mb(no_leak.proc.pid) - before
        assert play_episode(honest, OraclePolicy(), question_id=questions[2].question_id)["outcome"] == "correct"
    assert grown < 100, grown
