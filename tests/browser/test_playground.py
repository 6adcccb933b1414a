"""The `--web` server's playground page in a real browser: a real `python -m sqlenv serve --web` on 127.0.0.1.

Issue 43, finding 3: with OpenEnv's web interface, one UI socket (`/ws/ui`) that never read hung every reset and
step of the page, for every visitor, who all shared one episode. Here, with such a socket opened first and a
session on `/ws` that sends steps and never reads its replies, two visitors play episodes of their own to the end,
each step answered (within the page's generous wait), and each sees only their own.
"""

from __future__ import annotations

import contextlib
import json
import socket

import pytest

from serverproc import ServerProcess

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def web_server(builtin, chromium_path):
    pytest.importorskip("openenv.core", reason="the server extra is not installed")
    pytest.importorskip("playwright.sync_api")
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--web"]) as proc:
        yield proc


def _ui_socket_that_never_reads(port: int) -> socket.socket:
    """A WebSocket handshake to OpenEnv's `/ws/ui`, sent and never read (as the issue's probe did)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /ws/ui HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    return sock


@contextlib.contextmanager
def _session_that_never_reads(port: int):
    """A session on `/ws` that answers its question with 1,000,000 characters, then asks for the episode's state 30
    times (each reply carries the answer: ~30 MB, more than the sockets' buffers hold) and reads none of the
    replies: its client stops reading from the socket once one message waits (`max_queue=1`), so the server's
    sends to it stall."""
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None, open_timeout=10, max_queue=1) as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        ws.send(json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "7" * 1_000_000}}))
        for _ in range(30):
            ws.send(json.dumps({"type": "state"}))
        try:
            yield ws
        finally:
            ws.close_socket()  # dropped, unread


def _step(page, kind: str, argument: str, steps: int) -> None:
    page.select_option("#action-type", kind)
    page.fill("#argument", argument)
    page.click("#step")
    page.wait_for_function("n => document.querySelector('#steps').textContent.startsWith(n + ' taken')", arg=steps)


def test_visitors_play_their_own_episodes_past_sockets_that_never_read(web_server, browser, questions, screenshot):
    from sqlenv.scoring.verifier import format_answer

    first, second = questions[0], next(q for q in questions if q.question_text != questions[0].question_text)
    with contextlib.closing(_ui_socket_that_never_reads(web_server.port)), \
            _session_that_never_reads(web_server.port), contextlib.ExitStack() as contexts:
        pages = []
        for question in (first, second):
            page = contexts.enter_context(browser.new_context(viewport={"width": 1100, "height": 1000})).new_page()
            page.set_default_timeout(30_000)
            page.goto(web_server.url + "/")  # redirected to /web/
            page.fill("#question-id", question.question_id)
            page.click("#reset")
            page.wait_for_function("text => document.querySelector('#question').textContent === text",
                                   arg=question.question_text)
            pages.append(page)
        page, other = pages
        _step(page, "DESCRIBE", first.tables_involved[0], 1)
        assert first.tables_involved[0] in page.locator("#schema").inner_text()
        _step(page, "QUERY", first.gold_sql, 2)
        assert page.locator("#result").inner_text().strip()
        _step(page, "ANSWER", format_answer(first.gold_answer, first.answer_type), 3)
        page.locator("#gold").wait_for()
        assert page.locator("#outcome").inner_text() == "correct"
        assert page.locator("#gold-sql").inner_text() == first.gold_sql
        assert page.locator("#step").is_disabled()
        screenshot(page, "playground_correct")
        # The other visitor's episode is theirs: untouched by the first one's steps, and it plays on.
        assert other.locator("#question").inner_text() == second.question_text
        assert other.locator("#steps").inner_text().startswith("0 taken")
        _step(other, "QUERY", "SELEC nonsense", 1)
        assert other.locator("#error").inner_text().strip()  # the environment's own error, shown as text
        # A question id with markup comes back in an error message: shown as text, never as HTML.
        other.fill("#question-id", "<img src=x id=injected>")
        other.click("#reset")
        other.wait_for_function("() => document.querySelector('#error').textContent.includes('<img')")
        assert other.locator("#injected").count() == 0
        assert web_server.sessions()["open"] == 3  # the two visitors' and the silent session's; no shared one
    assert web_server.wait_sessions(0) == 0
