"""Issue 59's probes of the dashboard, against the running app (`python app.py` on 127.0.0.1, raw HTTP): what a
client holds with Server-Sent Events streams it never reads, and whether the login throttle holds for calls the
page never makes (the login box is greyed out until the page's load event; a client calls the events directly,
many at once, over both login events: the button's and the box's submit).
"""

from __future__ import annotations

import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app_server import app_config, call_event, serve

PASSWORD = "correct horse battery staple"


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@pytest.fixture(scope="module")
def app():
    with serve({"SQLENV_ADMIN_PASSWORD": PASSWORD}, log_name="probes59") as running:
        running["config"] = app_config(running["url"])
        yield running


def _login_events(config) -> list[dict]:
    events = [d for d in config["dependencies"] if d.get("backend_fn") and (d.get("api_name") or "") in ("login",
                                                                                                       "login_1")]
    assert len(events) == 2, [d.get("api_name") for d in config["dependencies"]]
    return events


def test_the_login_throttle_holds_for_direct_calls_at_once_over_both_login_events(app):
    """Twelve wrong passwords at once from one address, half through the button's event and half through the box's
    submit, with no page loaded (its login box still greyed out): at most five are checked, the rest told to wait,
    and the right password from that address is refused too; another address logs in."""
    url, logins = app["url"], _login_events(app["config"])

    def guess(i: int) -> str:
        return call_event(url, logins[i % 2]["id"], ["guess"], source="127.0.0.41")["output"][1]

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(guess, range(12)))
    checked = sum("Wrong password" in a for a in answers)
    assert checked <= 5 and sum("Too many" in a for a in answers) == 12 - checked, answers
    refused = call_event(url, logins[0]["id"], [PASSWORD], source="127.0.0.41")["output"]
    assert refused[0] == "" and "Too many" in refused[1]
    welcome = call_event(url, logins[1]["id"], [PASSWORD], source="127.0.0.42")["output"]
    assert welcome[0] and 'data-owner="true"' in welcome[1]


def test_event_streams_held_open_and_never_read_hold_nothing(app):
    """Forty event streams (`/gradio_api/queue/data`) from one address, each for an event it joined, never read:
    the app serves an honest client meanwhile, closes every stream once its event is done (the client reading
    nothing), and keeps no memory for them."""
    url, pid = app["url"], app["proc"].pid
    logout = next(d for d in app["config"]["dependencies"] if d.get("api_name") == "logout")
    before = _rss_mb(pid)
    hashes = [secrets.token_hex(6) for _ in range(40)]
    with httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.43")) as http:
        for session_hash in hashes:
            http.post(f"{url}gradio_api/queue/join", json={"data": [""], "fn_index": logout["id"],
                                                         "session_hash": session_hash, "event_data": None,
                                                         "trigger_id": None})
    streams = []
    for session_hash in hashes:
        sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/"))), timeout=10,
                                        source_address=("127.0.0.43", 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET /gradio_api/queue/data?session_hash={session_hash} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Accept: text/event-stream\r\n\r\n".encode())
        streams.append(sock)
    try:
        started = time.monotonic()
        assert httpx.get(url + "config", timeout=30).status_code == 200
        assert time.monotonic() - started < 5.0
        deadline = time.monotonic() + 40
        open_streams = streams
        while open_streams and time.monotonic() < deadline:
            time.sleep(1.0)
            still = []
            for sock in open_streams:
                sock.setblocking(False)
                try:
                    while True:  # the kernel kept what the app sent; a closed stream ends with EOF
                        if not sock.recv(65536):
                            break
                except BlockingIOError:
                    still.append(sock)
                except OSError:
                    pass
            open_streams = still
        assert not open_streams, f"{len(open_streams)} of {len(streams)} unread event streams still held at 40 s"
        assert _rss_mb(pid) - before < 50
    finally:
        for sock in streams:
            sock.close()
