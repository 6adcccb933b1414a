"""Every frame a WebSocket client sends is paced, not only pings and pongs: a real `python -m sqlenv serve` on
127.0.0.1, raw frames on real sockets.

Issue 59: a client reset, began a text message without finishing it (FIN 0), then sent empty continuation frames
(6 bytes each): ~8 million in 20 s held the event loop 17-19 s of 20 (`/health` 7.8-10.4 s) and +65-70 MB, for as
long as the socket stayed. The message bound counts payload bytes, which stayed at 1; only pings and pongs had an
allowance. Now every frame is charged (`sqlenv.server.connections.FrameAllowance`: frames and bytes per second, a
message in at most `MAX_FRAGMENTS` frames), and a connection past it is aborted.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from serverproc import ServerProcess, health_seconds, rss_mb  # noqa: E402

from sqlenv.server.connections import FRAME_BURST, MAX_FRAGMENTS, FrameAllowance  # noqa: E402

HANDSHAKE = (b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def frame(opcode: int, payload: bytes = b"", fin: bool = True) -> bytes:
    """A client's frame, masked with a zero key (so the payload goes as it is)."""
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = bytes([first, 0x80 | n])
    elif n < 65536:
        head = bytes([first, 0x80 | 126]) + struct.pack("!H", n)
    else:
        head = bytes([first, 0x80 | 127]) + struct.pack("!Q", n)
    return head + bytes(4) + payload


@pytest.fixture(scope="module")
def server(builtin):
    with ServerProcess(["--dataset", str(builtin.root), "--split", "train", "--max-sessions", "8",
                        "--max-sessions-per-client", "4", "--session-timeout", "30"]) as proc:
        yield proc



def _reset_socket(server, source: str) -> socket.socket:
    """A raw `/ws` from `source` that has reset (its observation read): a session, as the issue's client had."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=(source, 0))
    sock.sendall(HANDSHAKE)
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    sock.sendall(frame(0x1, json.dumps({"type": "reset", "data": {}}).encode()))
    first = sock.recv(2)  # the observation's frame: unmasked, FIN, text
    assert first[0] == 0x81
    n = first[1] & 0x7F
    n = struct.unpack("!H", sock.recv(2))[0] if n == 126 else struct.unpack("!Q", sock.recv(8))[0] if n == 127 else n
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    assert json.loads(body)["type"] == "observation"
    return sock


def _flood(sock: socket.socket, block: bytes, max_bytes: int, max_s: float) -> tuple[int, bool]:
    """Send `block` again and again (whole frames) until `max_bytes`, `max_s`, or the server ends the connection.
    Returns (bytes the kernel took, whether the server ended it)."""
    sock.setblocking(False)
    sent, started = 0, time.monotonic()
    while sent < max_bytes and time.monotonic() - started < max_s:
        try:
            sent += sock.send(block[sent % len(block):])
        except BlockingIOError:
            time.sleep(0.005)
        except (ConnectionResetError, BrokenPipeError):
            return sent, True
    # The server may have aborted after the last send went out: one more send tells.
    time.sleep(0.5)
    try:
        sock.send(block[:6])
        sock.send(block[:6])
    except (ConnectionResetError, BrokenPipeError):
        return sent, True
    return sent, False


def test_empty_continuation_frames_end_the_connection(server):
    """The issue's shape: a reset, a text frame with FIN 0, then empty continuation frames. The old server took
    every one (~400,000 a second, held for as long as the client stayed); now the connection is aborted past the
    allowance, its session ends, and `/health` never waits on it."""
    pid = server.proc.pid
    before = rss_mb(pid)
    sock = _reset_socket(server, "127.0.0.3")
    try:
        sock.sendall(frame(0x1, b"{", fin=False))
        block = frame(0x0, b"", fin=False) * 20_000  # 120 KB of empty continuation frames
        sent, ended = _flood(sock, block, 64 * 1024 * 1024, 4.0)
        assert ended, f"the server took {sent} bytes of empty continuation frames and kept the connection"
        assert health_seconds(server, 30) < 1.0
        assert rss_mb(pid) - before < 10.0
        assert server.wait_sessions(0, timeout=10) == 0
    finally:
        sock.close()


def test_a_message_in_one_byte_fragments_ends_the_connection(server):
    """A 1 MB message in 1-byte fragments: within the message's byte bound, but a million frames, each kept by
    uvicorn until the last (~40 MB) and each parsed on the event loop. Past `MAX_FRAGMENTS` the connection is
    aborted; a message in a few fragments is still read whole."""
    honest = _reset_socket(server, "127.0.0.4")
    try:  # a step in three fragments is a step
        step = json.dumps({"type": "step", "data": {"action_type": "QUERY", "argument": "SELECT 1"}}).encode()
        honest.sendall(frame(0x1, step[:10], fin=False) + frame(0x0, step[10:20], fin=False) + frame(0x0, step[20:]))
        assert honest.recv(1)[0] == 0x81  # a reply frame, not an abort
    finally:
        honest.close()
    pid = server.proc.pid
    before = rss_mb(pid)
    sock = _reset_socket(server, "127.0.0.5")
    try:
        message = json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "x" * 1_000_000}})
        fragments = b"".join(frame(0x1 if i == 0 else 0x0, message[i:i + 1].encode(), fin=i == len(message) - 1)
                             for i in range(len(message)))
        sent, ended = _flood(sock, fragments, len(fragments), 4.0)
        assert ended, f"the server took {sent} bytes of 1-byte fragments and kept the connection"
        assert health_seconds(server, 30) < 1.0
        assert rss_mb(pid) - before < 10.0
        assert server.wait_sessions(0, timeout=10) == 0
    finally:
        sock.close()


def test_the_allowance_charges_every_kind_of_frame():
    """The allowance itself: a burst, then a rate; pings tighter; a message's fragments counted until its last; a
    message the app takes gives its last frame back."""
    allowance = FrameAllowance(now=0.0)
    for _ in range(FRAME_BURST):
        assert allowance.charge(0x1, True, 10, now=0.0) is None
    assert "frames" in allowance.charge(0x1, True, 10, now=0.0)
    assert allowance.charge(0x1, True, 10, now=1.0) is None  # a second later: room again
    pings = FrameAllowance(now=0.0)
    assert "pings" in next(why for why in (pings.charge(0x9, True, 0, now=0.0) for _ in range(40)) if why)
    fragments = FrameAllowance(now=0.0)
    assert fragments.charge(0x1, False, 1, now=0.0) is None
    whys = [fragments.charge(0x0, False, 0, now=i / 10) for i in range(1, MAX_FRAGMENTS + 1)]
    assert whys[:-1] == [None] * (MAX_FRAGMENTS - 1) and whys[-1].startswith("a message in more than")
    stepper = FrameAllowance(now=0.0)  # messages the app takes as they come cost nothing: a client stepping fast
    for _ in range(4 * FRAME_BURST):
        assert stepper.charge(0x1, True, 100, now=0.0) is None
        stepper.taken()
    ahead = FrameAllowance(now=0.0)  # messages sent ahead of the app are bounded by the burst
    assert [ahead.charge(0x1, True, 100, now=0.0) for _ in range(FRAME_BURST + 1)][-1] is not None
    again = FrameAllowance(now=0.0)
    for message in range(3):  # finished messages start counting again
        assert again.charge(0x1, False, 1, now=message) is None
        assert all(again.charge(0x0, i == 9, 1, now=message) is None for i in range(10))
