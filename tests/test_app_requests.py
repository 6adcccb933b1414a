"""What one anonymous request may make the dashboard read and keep: a real `python app.py` on 127.0.0.1.

Issue 35, finding 4: Gradio stores every input of an event in the caller's session before any handler runs, and
kept 10,000 sessions; request bodies had no bound. A 38 MiB table sent to the Runs table's `select_row` with a
new session hash each time grew the app by ~38 MB a call, for minutes; a 38 MB string the app refused (Play's
dataset) still kept +38 MB. Now bodies over `MAX_BODY_BYTES` get 413 unread on every route, each input value is
sized against its component's limit before Gradio reads it, and the app keeps `SQLENV_APP_SESSIONS` sessions.
"""

from __future__ import annotations

import json
import secrets
import socket
import time

import httpx
import pytest

from app_server import app_config, call_event, serve
from dashboard.access.http_guard import MAX_BODY_BYTES
from dashboard.access.inputs import MAX_SMALL_INPUT_BYTES, MAX_TABLE_BYTES, python_size

SESSIONS_KEPT = 8
BODY_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def app():
    with serve({"SQLENV_APP_SESSIONS": str(SESSIONS_KEPT), "SQLENV_APP_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)},
               log_name="requests") as served:
        served["config"] = app_config(served["url"])
        served["port"] = int(served["url"].rstrip("/").rsplit(":", 1)[1])
        yield served


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def dependency(config, api_name):
    return next(d for d in config["dependencies"] if d.get("api_name") == api_name and d.get("backend_fn"))


def raw_reply(port: int, head: bytes, chunks, wait_s: float = 10.0) -> tuple[bytes, int]:
    """Send `head` then `chunks` on one connection, stopping when the server answers (or closes); returns
    (what it answered, bytes of the body sent)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        reply = b""
        for chunk in chunks:
            try:
                reply += sock.recv(65536)
            except BlockingIOError:
                pass
            if reply:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                break
            sent += len(chunk)
        sock.settimeout(wait_s)
        try:
            while b"\r\n\r\n" not in reply:
                more = sock.recv(65536)
                if not more:
                    break
                reply += more
        except (TimeoutError, ConnectionResetError):
            pass
    return reply, sent


def test_the_start_log_names_where_client_addresses_come_from(app):
    """Issue 59: the dashboard says at start whose address it believes; off a Space, with no setting, the TCP peer."""
    log = app["log"].read_text()
    assert "client addresses: the TCP peer" in log and "X-Forwarded-For is ignored" in log, log[-2000:]


def test_a_body_over_the_bound_is_refused_before_it_is_read(app):
    """A declared 40 MB body is answered at once (today's app waited for all of it, then parsed and kept it);
    a chunked one is cut where it passes the bound, on an event route and on any other."""
    port = app["port"]
    head = (b"POST /gradio_api/queue/join HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 40000000\r\n\r\n")
    started = time.monotonic()
    reply, sent = raw_reply(port, head, [b'{"data": ["' + b"x" * 65536] + [b"x" * 65536] * 4, wait_s=10)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert time.monotonic() - started < 8 and sent < 1_000_000

    chunk = b"x" * 65536
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    for path, kind in ((b"/gradio_api/queue/join", b"application/json"),
                       (b"/gradio_api/run-history/connect", b"application/json"),
                       (b"/login", b"application/x-www-form-urlencoded")):
        head = (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + kind + b"\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        reply, sent = raw_reply(port, head, [framed] * 1024)  # 64 MiB, if it were all read
        assert reply.startswith(b"HTTP/1.1 413"), (path, reply[:200])
        assert sent < 16 * MAX_BODY_BYTES, (path, sent)  # the server stopped reading (socket buffers hold the rest)
    assert app["proc"].poll() is None


def test_a_body_that_does_not_arrive_in_time_is_dropped(app):
    """A client that sends its body a byte at a time (or never) is answered 408 once the body's deadline passes, on
    an event route and on any other (before, the app waited as long as the client liked, a coroutine and a
    connection held)."""
    port = app["port"]
    for path, kind in ((b"/gradio_api/queue/join", b"application/json"),
                       (b"/login", b"application/x-www-form-urlencoded")):
        head = (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + kind + b"\r\n"
                b"Content-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=BODY_TIMEOUT_S + 20) as sock:
            sock.sendall(head)
            reply = b""
            while b"\r\n\r\n" not in reply:
                more = sock.recv(65536)
                if not more:
                    break
                reply += more
        waited = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 408"), (path, reply[:200])
        assert BODY_TIMEOUT_S - 0.5 <= waited, (path, waited)  # not before the deadline: an honest slow upload
    assert app["proc"].poll() is None


def test_request_heads_have_a_deadline_and_one_client_a_bounded_share_of_connections(app):
    """Issue 43, finding 6: Gradio's own uvicorn waited for a request head for ever (300 partial heads were still
    held at 65 s) and took any number of connections (20,000 took every descriptor; honest GETs were reset). The
    app now serves with the OpenEnv server's head deadline (here BODY_TIMEOUT_S) and bounds connections (one
    client holds at most CONNECTIONS_PER_CLIENT, the rest closed as they are accepted: tests/test_http_connections.py
    checks the bounds); another client (127.0.0.1) is answered meanwhile."""
    import selectors

    port = app["port"]
    socks = []
    try:
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=("127.0.0.2", 0))
            socks.append(sock)
            try:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed as it was accepted
        assert httpx.get(app["url"], timeout=30).status_code == 200  # another client
        watching = selectors.DefaultSelector()  # (select() cannot watch descriptors past 1,024)
        for sock in socks:
            watching.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + BODY_TIMEOUT_S + 30
        while watching.get_map() and time.monotonic() < deadline:  # each closed: at once, or at the head deadline
            for key, _ in watching.select(1.0):
                try:
                    data = key.fileobj.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    data = b""
                assert data == b"", data[:200]  # closed without an answer
                watching.unregister(key.fileobj)
        assert not watching.get_map(), f"{len(watching.get_map())} partial heads still held"
    finally:
        for sock in socks:
            sock.close()
    assert httpx.get(app["url"], timeout=30).status_code == 200 and app["proc"].poll() is None


def test_each_input_is_sized_before_gradio_keeps_it(app):
    """A value over what its component needs is refused naming the input; one within it reaches the handler's
    own check, whose message the page shows."""
    config, url = app["config"], app["url"]
    new = dependency(config, "new_episode")
    small_enough = call_event(url, new["id"], ["x" * 5000, "eval", "random", 15, None])
    assert small_enough["success"] and "Dataset is too long: 5,000 characters" in small_enough["output"][1]
    too_big = call_event(url, new["id"], ["x" * (MAX_SMALL_INPUT_BYTES + 1), "eval", "random", 15, None])
    assert not too_big["success"] and "413" in too_big["error"] and "Dataset" in too_big["error"], too_big
    step = dependency(config, "do_step")
    argument = call_event(url, step["id"], ["QUERY", "\U0001F600" * 20_000, None])  # the longest argument allowed
    assert argument["success"], argument
    refused = call_event(url, step["id"], ["QUERY", "x" * 100_000, None])
    assert not refused["success"] and "Argument" in refused["error"], refused
    hashed = call_event(url, new["id"], ["builtin", "eval", "random", 15, None], session_hash="s" * 1000)
    assert not hashed["success"] and "session hash" in hashed["error"], hashed
    # The values Gradio's own client sends by API name are held to the same limits.
    by_name = httpx.post(url + "gradio_api/call/new_episode", json={"data": ["x" * 100_000, "eval", "random", 15, None]})
    assert by_name.status_code == 413, by_name.text[:200]


def table(rows: int) -> dict:
    """A Runs table as the page sends it with a row selection (9 columns of short text)."""
    headers = ["run", "status", "model", "dataset", "steps", "success", "EX", "measured on", "started"]
    data = [[f"run-{secrets.token_hex(8)}-{i}", "completed", "builtin:tiny", "builtin", str(i), "50.0%", "40.0%",
             "final comparison, 100 questions", "2026-01-01T00:00:00"] for i in range(rows)]
    return {"headers": headers, "data": data, "metadata": None}


def select_row(url: str, fn_index: int, value: dict, session_hash: str) -> int:
    """The Runs table's `select_row` with `value` as the table: the HTTP status of its queue join."""
    body = {"data": [value], "fn_index": fn_index, "session_hash": session_hash, "trigger_id": None,
            "event_data": {"index": [0, 0], "value": value["data"][0][0], "row_value": value["data"][0],
                           "selected": True}}
    with httpx.Client(timeout=60) as http:
        joined = http.post(url + "gradio_api/queue/join", json=body)
        if joined.status_code != 200:
            return joined.status_code
        with http.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session_hash}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                    break
    return joined.status_code


def test_many_new_sessions_keep_a_bounded_amount_of_memory(app):
    """40 anonymous sessions, each sending the largest table allowed to `select_row` and a 3 MB dataset name
    to Play: today's app kept every one (~150 MB); now the names are refused unread and the app keeps
    SESSIONS_KEPT sessions of at most ~1.5 MB each."""
    config, url, pid = app["config"], app["url"], app["proc"].pid
    select = dependency(config, "select_row")
    new = dependency(config, "new_episode")
    rows = 1
    while python_size(table(rows * 2), MAX_TABLE_BYTES) <= MAX_TABLE_BYTES:
        rows *= 2
    value = table(rows)  # within the limit, ~half of it or more
    assert python_size(value, MAX_TABLE_BYTES) <= MAX_TABLE_BYTES
    for warm in range(3):  # the first calls load what every later one shares
        select_row(url, select["id"], value, f"warm-{warm}")
    before = rss_mb(pid)
    big_name = "d" * 3_000_000
    for i in range(40):
        session = f"visitor-{i}-{secrets.token_hex(4)}"
        assert select_row(url, select["id"], value, session) == 200
        call_event(url, new["id"], [big_name, "eval", "random", 15, None], session_hash=session)
    time.sleep(1.0)
    grown = rss_mb(pid) - before
    # SESSIONS_KEPT sessions of ~1.5 MB at most (page state and inputs), and the allocator's slack.
    assert grown < 45, f"RSS grew {grown:.0f} MB over 40 sessions"
    assert app["proc"].poll() is None


def test_the_body_deadline_setting_is_checked():
    from dashboard.access.http_guard import DEFAULT_BODY_TIMEOUT_S, body_timeout_s

    assert body_timeout_s({}) == DEFAULT_BODY_TIMEOUT_S and body_timeout_s({"SQLENV_APP_BODY_TIMEOUT_S": "2.5"}) == 2.5
    for bad in ("0", "-1", "ten", "nan", "1e9"):
        with pytest.raises(ValueError, match="SQLENV_APP_BODY_TIMEOUT_S"):
            body_timeout_s({"SQLENV_APP_BODY_TIMEOUT_S": bad})
