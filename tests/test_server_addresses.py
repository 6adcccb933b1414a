"""Where the server's client addresses come from, as the image runs it, and over IPv6: real servers, real sockets.

Issue 59, finding 2: the image set `SQLENV_PROXY_HOPS=1` everywhere, so with no proxy in front (plain `docker run -p`)
the server believed any client's `X-Forwarded-For`: one TCP address opened 64 `/ws` sessions each naming another
address, took 64 of 64, and honest clients were refused. Now a forwarded address is trusted only where the platform
says a proxy is in front (a HuggingFace Space: `SPACE_ID` and `SYSTEM=spaces`), and the start log says which source
the server uses. The probe of IPv6 clients on `::1`: the server binds, serves and counts them as one client (an
IPv6 client is its /64) whatever header they send.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import time
import urllib.request

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import REPO, ServerProcess, end_process, free_port  # noqa: E402

from sqlenv.client_address import address_source, proxy_hops_setting  # noqa: E402

#: What the platform and an operator may set; each test states what it sets, nothing is inherited.
ADDRESS_ENV = ("SQLENV_PROXY_HOPS", "FORWARDED_ALLOW_IPS", "SPACE_ID", "SYSTEM", "SPACE_AUTHOR_NAME")
SPACE = {"SPACE_ID": "someone/sqlenv", "SYSTEM": "spaces"}


def image_env() -> dict[str, str]:
    """The environment the Dockerfile's `ENV` lines give the server (what they say of addresses; paths stay local)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            found.update(re.findall(r"(\w+)=(\S+)", line[4:]))
    return {k: v for k, v in found.items() if k in ADDRESS_ENV}


def image_command() -> list[str]:
    """The Dockerfile's CMD, on 127.0.0.1 and a free port (`{port}`)."""
    cmd_line = next(line for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    command = json.loads(cmd_line[4:])
    command[0] = sys.executable
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = "{port}"
    return command


def _ws(port: int, source: str, forwarded: str | None = None, host: str = "127.0.0.1"):
    from websockets.sync.client import connect

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((host, port))
    shown = f"[{host}]" if ":" in host else host
    headers = [("X-Forwarded-For", forwarded)] if forwarded else []
    return connect(f"ws://{shown}:{port}/ws", sock=sock, proxy=None, compression=None, open_timeout=10,
                   additional_headers=headers)


def _answer(ws) -> dict:
    """The server's answer to a reset: an observation, or the refusal it sent at once (or a close)."""
    from websockets.exceptions import ConnectionClosed

    try:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        return json.loads(ws.recv(timeout=30))
    except ConnectionClosed:
        return {"type": "closed"}


def test_the_proxy_setting_is_safe_by_default_and_says_where_addresses_come_from():
    """No setting: one hop on a Space (its proxy is in front), none elsewhere; a setting always wins."""
    assert proxy_hops_setting(env={}) == 0
    assert proxy_hops_setting(env={"SPACE_ID": "someone/sqlenv"}) == 0  # not the Space's whole word
    assert proxy_hops_setting(env=SPACE) == 1
    assert proxy_hops_setting(env={**SPACE, "SQLENV_PROXY_HOPS": "0"}) == 0
    assert proxy_hops_setting(env={**SPACE, "FORWARDED_ALLOW_IPS": "10.0.0.5"}) == 0  # uvicorn's list instead
    assert proxy_hops_setting(env={"SQLENV_PROXY_HOPS": "2"}) == 2
    assert "the TCP peer" in address_source(0, {})
    assert "HuggingFace Space" in address_source(1, SPACE)
    assert "SQLENV_PROXY_HOPS=2" in address_source(2, {"SQLENV_PROXY_HOPS": "2"})
    assert "FORWARDED_ALLOW_IPS=10.0.0.5" in address_source(0, {"FORWARDED_ALLOW_IPS": "10.0.0.5"})


@pytest.fixture()
def image_server(builtin, monkeypatch):
    """The Dockerfile's CMD with the image's environment, and no Space around it (plain `docker run -p`)."""
    for name in ADDRESS_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in image_env().items():
        monkeypatch.setenv(name, value)
    with ServerProcess(command=image_command()) as proc:
        yield proc


def test_the_image_trusts_no_forwarded_address_without_a_proxy_in_front(image_server):
    """One TCP address (127.0.0.2) opens 64 `/ws` sessions, each naming another address in `X-Forwarded-For`: the
    image's old `SQLENV_PROXY_HOPS=1` gave it 64 of 64 and honest clients were refused. Now it is one client, held to
    its share, and honest clients are served."""
    server = image_server
    assert "client addresses: the TCP peer" in server.log, server.log[-2000:]
    with contextlib.ExitStack() as stack:
        forged = [stack.enter_context(_ws(server.port, "127.0.0.2", forwarded=f"198.51.100.{i}")) for i in range(64)]
        deadline = time.monotonic() + 10
        while server.sessions()["open"] > 16 and time.monotonic() < deadline:
            time.sleep(0.1)
        held = server.sessions()["open"]
        assert held <= 16, f"one TCP address took {held} sessions by naming others in X-Forwarded-For"
        for i in range(3):
            honest = stack.enter_context(_ws(server.port, f"127.0.0.{10 + i}"))
            assert _answer(honest)["type"] == "observation"
        del forged


@pytest.fixture()
def ipv6_server(builtin):
    """A server bound to `::1` (skipped where this machine has no IPv6 loopback)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ADDRESS_ENV}
    import subprocess
    import tempfile

    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "sqlenv", "serve", "--dataset", str(builtin.root), "--split", "train",
                             "--host", "::1", "--port", str(port), "--max-sessions", "8",
                             "--max-sessions-per-client", "2"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**env, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server on ::1 did not start"
            try:
                with urllib.request.urlopen(f"http://[::1]:{port}/health", timeout=1) as response:
                    if json.loads(response.read())["status"] == "healthy":
                        break
            except OSError:
                time.sleep(0.2)
        log.seek(0)
        proc.start_log = log.read().decode()
        proc.port = port
        yield proc
    finally:
        end_process(proc)
        log.close()


def test_ipv6_clients_on_the_loopback_are_served_and_counted_as_one_client(ipv6_server):
    """On `::1`: the start line names the URL as a client types it, clients are served, `::1` is one client (its
    /64) held to `--max-sessions-per-client` whatever `X-Forwarded-For` it sends, and its sessions end with it."""
    port = ipv6_server.port
    assert f"http://[::1]:{port}" in ipv6_server.start_log, ipv6_server.start_log
    with contextlib.ExitStack() as stack:
        first = [stack.enter_context(_ws(port, "::1", forwarded=f"2001:db8::{i}", host="::1")) for i in range(2)]
        assert all(_answer(ws)["type"] == "observation" for ws in first)
        third = stack.enter_context(_ws(port, "::1", forwarded="2001:db8:1::1", host="::1"))
        refused = _answer(third)
        assert refused["type"] in ("error", "closed") and refused.get("data", {}).get("code", "CAPACITY_REACHED") == \
            "CAPACITY_REACHED", refused
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://[::1]:{port}/sessions", timeout=5) as response:
            if json.loads(response.read())["open"] == 0:
                break
        time.sleep(0.1)
    else:
        pytest.fail("sessions of IPv6 clients outlived their sockets")
