"""What one request may cost the OpenAI-compatible server (`training.generation.openai_server`): a real server around
the built-in tiny model on 127.0.0.1, real HTTP.

Issue 59, finding 3: the server read a body of any size, then rendered and tokenized the prompt on its event loop
before the context check (one 20 MB message: 33.9 s to a 400, `/health` blocked 33.7 s, RSS 485 -> 3,041 MB); a
non-number `n` answered 500. Now a body over the bound is refused (413) before it is read, every field is checked
before any work (400 naming it), and rendering runs off the event loop.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from serverproc import ServerProcess, health_seconds, rss_mb

pytest.importorskip("fastapi", reason="the server needs FastAPI")

MB = 1_000_000


@pytest.fixture(scope="module")
def server():
    command = [sys.executable, "-m", "training.generation.openai_server", "--model", "builtin:tiny",
               "--served-name", "tiny", "--port", "{port}", "--threads", "1"]
    with ServerProcess(command=command) as proc:
        yield proc



def _post(server, raw: bytes, timeout: float = 120) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + "/v1/chat/completions", data=raw, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _reply(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


OK = {"model": "tiny", "messages": [{"role": "user", "content": "How many singers?"}], "max_tokens": 2}


def test_a_body_over_the_bound_is_refused_before_it_is_read(server):
    """A declared 20 MB body is answered 413 from its head (the old server read it all, then spent 33.9 s on it);
    one sent without a length is cut where it passes the bound. `/health` never waits."""
    before = rss_mb(server.proc.pid)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 20000000\r\n\r\n" + b'{"messages": [{"role": "user", "content": "' + b"x" * 65536)
        started = time.monotonic()
        head = _reply(sock)
        assert head.startswith(b"HTTP/1.1 413"), head[:200]
        assert time.monotonic() - started < 5.0
    assert health_seconds(server, 60) < 0.5
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            for _ in range(40):  # 2.6 MB offered, the bound is 1 MiB
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _reply(sock).startswith(b"HTTP/1.1 413")
    assert health_seconds(server, 60) < 0.5
    assert rss_mb(server.proc.pid) - before < 50


@pytest.mark.parametrize("raw, needle", [
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": "abc"}', "n must be 1"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 1e400}', "n must be 1"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}', "n must be 1"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "temperature"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}', "max_tokens"),
    (b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": [1]}]}', "messages[0]"),
    (b'{"model": "tiny", "messages": [{"role": "assistant", "tool_calls": ["x"]}]}', "tool call"),
    (b'{"model": "tiny", "messages": [{"role": "tool", "name": 7, "content": "x"}]}', "name"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", '
     b'"function": {}}]}', "name"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": '
     b'{"tokenize": false}}', "chat_template_kwargs"),
    (b"[" * 100_000, "not JSON"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}] * 2000}).encode(), "at most"),
])
def test_every_field_is_checked_before_any_work(server, raw, needle):
    status, body = _post(server, raw)
    assert status == 400 and needle in body["error"]["message"], (status, body)


def test_rendering_and_tokenizing_run_off_the_event_loop(server):
    """~1 MB of messages, longer than the tiny model's context: the old server rendered and tokenized them on its
    event loop (~1.7 s here, 33.9 s for 20 MB) before its context check, and `/health` waited as long. Now the
    answer is the same 400, and `/health` answers meanwhile."""
    long = json.dumps({"model": "tiny", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "select singers from concert " * 32}] * 1000})
    assert len(long) < 1024 * 1024
    done: list = []
    poster = threading.Thread(target=lambda: done.append(_post(server, long.encode())))
    poster.start()
    slowest = 0.0
    while poster.is_alive():
        slowest = max(slowest, health_seconds(server, 60))
        time.sleep(0.02)
    poster.join()
    status, body = done[0]
    assert status == 400 and "maximum context length" in body["error"]["message"], (status, body)
    assert slowest < 0.5, f"/health waited {slowest:.2f} s while a prompt was rendered"
    status, body = _post(server, json.dumps(OK).encode())
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
