"""Issue 59's shapes against a real server: frames that complete no message, and addresses named by a header.

    python bench/security/frame_floods.py [--shapes continuation,fragments,forwarded] [--flood-s 20] [--web]
                                          [--server-repo DIR]

Starts `python -m sqlenv serve` on 127.0.0.1 (a free port, the default limits, a 20 s session timeout as the issue's
probe had; with `--web` as the Dockerfile's CMD runs it; with the image's environment (the server checkout's
Dockerfile `ENV` lines on client addresses) and no Space, as plain `docker run -p` runs the image) and plays each
shape:

1. continuation: for `--flood-s` seconds one client (127.0.0.7) resets, begins a text message without finishing it
   (FIN 0), then sends empty continuation frames (6 bytes each) as fast as the server takes them, reading nothing;
   when the server ends the connection it connects again and starts over (and when it has not within 3 s: a
   connection kept). Meanwhile honest episodes are played back to back from 127.0.0.1 (on a thread of their own) and `/health` is asked every 0.1 s. Figures: frames offered (written by the client;
   most lie in the two kernels' buffers when the server ends the connection, unread), connections the server ended, `/health` at its slowest and its median, the honest episodes (how many, all
   correct, the slowest), the server's RSS before and at its peak.
2. fragments: the same, each connection sending a 1 MB message in 1-byte fragments (7 bytes a frame).
3. forwarded: one TCP address (127.0.0.8) opens 64 `/ws` sessions, each naming another address in
   `X-Forwarded-For`; then 10 honest episodes from 127.0.0.1: sessions it got, episodes served.

`--server-repo DIR` runs the server from another checkout (e.g. `git archive 72f108f | tar -x -C DIR`, with DIR's
`data/builtin` built) to measure before a change. The machine is shared: times are upper bounds. Prints, last line
one JSON object. The soak (`bench/security/soak.py`) makes these shapes among its hostile sessions
(`continuation-flood`, `fragments`, `forwarded-for`) with the coroutines here.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from websocket_holds import (Watch, honest_episode, raw_websocket, rss_mb, server_process,  # noqa: E402
                             try_reset, ws_connect)

from sqlenv.data.datasets import load_questions, resolve_dataset  # noqa: E402

MB = 1_000_000
ADDRESS_ENV = ("SQLENV_PROXY_HOPS", "FORWARDED_ALLOW_IPS", "SPACE_ID", "SYSTEM")


def frame(opcode: int, payload: bytes = b"", fin: bool = True) -> bytes:
    """A client's frame (payload < 126 bytes), masked with a zero key."""
    return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + bytes(4) + payload


RESET = json.dumps({"type": "reset", "data": {}}).encode()
CONTINUATIONS = frame(0x0, b"", fin=False) * 20_000  # 120 KB of empty continuation frames


@functools.cache
def fragments() -> bytes:
    """A 1 MB message (a step's ANSWER) in 1-byte fragments: ~7 MB of frames, whole (built by slices: a loop over
    a million frames would stall the caller's event loop for a second or two)."""
    message = json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "x" * MB}}).encode()
    n = len(message)
    out = bytearray(7 * n)  # each frame: opcode byte, 0x81 (masked, 1 byte), a zero mask, the byte
    out[0::7] = bytes([0x00]) * n  # continuations with FIN 0 ...
    out[0] = 0x01  # ... after a text frame's start,
    out[7 * (n - 1)] = 0x80  # ... and FIN on the last
    out[1::7] = bytes([0x81]) * n
    out[6::7] = message
    return bytes(out)


async def frame_flood(port: int, source: str, shape: str, until: float, kept_s: float = 3.0) -> dict:
    """One client's flood of `shape` ("continuation" or "fragments") from `source` until `until` (monotonic time),
    connecting again whenever the server ends the connection. Returns frames_offered (written: what the server read
    of them is not known here), connections, ended (by the server), refused (handshakes refused) and kept
    (connections open `kept_s` seconds or more: the server went on reading them; a continuation flood is then
    dropped by the client, which connects again)."""
    frames = connections = ended = refused = kept = 0
    frame_bytes = 6 if shape == "continuation" else 7
    while time.monotonic() < until:
        try:
            reader, writer = await raw_websocket(port, "/ws", source)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            refused += 1
            await asyncio.sleep(0.05)
            continue
        connections += 1
        writer.transport.set_write_buffer_limits(high=256 * 1024)
        opened = time.monotonic()
        written = 0
        try:
            if shape == "continuation":
                writer.write(frame(0x1, RESET) + frame(0x1, b"{", fin=False))
                while time.monotonic() < until and time.monotonic() - opened < kept_s:
                    writer.write(CONTINUATIONS)
                    written += len(CONTINUATIONS)
                    await asyncio.wait_for(writer.drain(), max(1.0, until - time.monotonic()))
            else:
                writer.write(fragments())
                written += len(fragments())
                await asyncio.wait_for(writer.drain(), max(1.0, until - time.monotonic()))
                await asyncio.wait_for(reader.read(1), kept_s)  # an answer (or EOF) from a server that read it all
        except (ConnectionError, OSError):
            ended += 1
        except asyncio.TimeoutError:
            pass
        finally:
            kept += time.monotonic() - opened >= kept_s  # open that long: the server took what it was sent
            frames += written // frame_bytes
            writer.transport.abort()
    return {"frames_offered": frames, "connections": connections, "ended": ended, "refused": refused, "kept": kept}


async def honest_loop(port: int, questions: list, until: float) -> list[tuple[bool, float]]:
    """Honest episodes back to back from 127.0.0.1 until `until`: (correct, seconds) each."""
    results = []
    index = 0
    while time.monotonic() < until:
        started = time.monotonic()
        correct = await honest_episode(port, "127.0.0.1", questions[index % len(questions)])
        results.append((correct, time.monotonic() - started))
        index += 1
    return results


async def shape_flood(server, questions: list, shape: str, flood_s: float) -> dict:
    pid = server.proc.pid
    before = rss_mb(pid)
    with Watch(server.port, pid) as watch:
        until = time.monotonic() + flood_s
        # The honest client on a thread and event loop of its own: the flood's writes do not delay its replies.
        flood, honest = await asyncio.gather(frame_flood(server.port, "127.0.0.7", shape, until),
                                             asyncio.to_thread(asyncio.run, honest_loop(server.port, questions, until)))
    times = [s for _, s in honest]
    return {f"{shape}_{k}": v for k, v in {
        **flood, "health_max_s": watch.health_max_s,
        "health_median_s": round(statistics.median(watch.health), 3) if watch.health else None,
        "health_calls": len(watch.health), "honest_episodes": len(honest),
        "honest_correct": sum(c for c, _ in honest), "honest_max_s": round(max(times, default=float("nan")), 2),
        "rss_before_mb": round(before), "rss_peak_mb": round(watch.rss_peak),
        "rss_growth_mb": round(watch.rss_peak - before)}.items()}


async def shape_forwarded(server, questions: list) -> dict:
    opened, refusals = [], 0
    for i in range(64):
        try:
            opened.append(await ws_connect(server.port, "/ws", "127.0.0.8",
                                           additional_headers=[("X-Forwarded-For", f"198.51.100.{i}")]))
        except Exception:  # noqa: BLE001 - refused at the handshake
            refusals += 1
    await asyncio.sleep(1.0)
    held = server.sessions()["open"]
    served = [await honest_episode(server.port, "127.0.0.1", q) for q in questions[:10]]
    for ws in opened:
        ws.transport.abort()
    return {"forwarded_sessions_named": 64, "forwarded_sessions_held": held,
            "forwarded_honest_served": f"{sum(served)} of {len(served)}"}


# ------------------------------------------------------------------------- the soak's attacks (soak.py)
async def flood_attack(port: int, source: str, shape: str, seconds: float, tally) -> None:
    """`continuation-flood` / `fragments` for the soak: a connection the server did not end within 5 s (the old
    server read a continuation flood for as long as it came, and a 1 MB message in 1-byte fragments whole, ~7 s)
    is a breach."""
    result = await frame_flood(port, source, shape, time.monotonic() + seconds, kept_s=5.0)
    tally.requests += result["connections"]
    tally.hostile_refused += result["ended"] + result["refused"]
    if result["kept"]:
        tally.breaches.append(f"{result['kept']} {shape} connection(s) kept instead of ended")


#: One `forwarded-for` attack at a time: two at once from one address share its sessions.
_FORWARDED_AT_ONCE = asyncio.Lock()
#: What the server's guard says when it refuses a client its share (`sqlenv.server.websocket_guard.SessionShares`).
SHARE_REFUSAL = "this client address"


async def forwarded_attack(port: int, source: str, hold_s: float, tally, per_client: int = 16) -> None:
    """`forwarded-for` for the soak: `per_client` + 8 WebSockets from one address, each naming another in
    `X-Forwarded-For`, reset, held `hold_s`. The server trusts no proxy here, so they are one client: past its
    share they are refused by the guard, saying so. Two or more held and none refused for the address's share is a
    breach (each name was a client of its own)."""
    async with _FORWARDED_AT_ONCE:
        await _forwarded(port, source, hold_s, tally, per_client)


async def _forwarded(port: int, source: str, hold_s: float, tally, per_client: int) -> None:
    opened, refusals = [], 0
    for i in range(per_client + 8):
        try:
            opened.append(await ws_connect(port, "/ws", source,
                                           additional_headers=[("X-Forwarded-For", f"198.51.100.{i}")]))
        except Exception:  # noqa: BLE001 - refused at the handshake
            refusals += 1
    try:
        replies = await asyncio.gather(*(try_reset(ws) for ws in opened))
        held = sum(r.get("type") == "observation" for r in replies)
        share_refusals = sum(SHARE_REFUSAL in str(r.get("data", {}).get("message", "")) for r in replies)
        tally.requests += per_client + 8
        tally.hostile_refused += per_client + 8 - held
        if held > per_client or (held >= 2 and not share_refusals):
            tally.breaches.append(f"{held} sessions from one address naming others in X-Forwarded-For, none "
                                  "refused for the address's share")
        await asyncio.sleep(hold_s)
    finally:
        for ws in opened:
            ws.transport.abort()


def image_env(repo: Path) -> dict[str, str]:
    """What `repo`'s Dockerfile `ENV` lines say of client addresses (the image's defaults)."""
    text = (repo / "Dockerfile").read_text().replace("\\\n", " ")
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            found.update(re.findall(r"(\w+)=(\S+)", line[4:]))
    return {k: v for k, v in found.items() if k in ADDRESS_ENV}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="continuation,fragments,forwarded", help="comma-separated (default all)")
    parser.add_argument("--flood-s", type=float, default=20.0, help="seconds each flood lasts (default 20)")
    parser.add_argument("--web", action="store_true", help="start the server with --web, as the Dockerfile does")
    parser.add_argument("--server-repo", type=Path, default=REPO, help="the checkout whose `sqlenv` the server runs")
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if set(shapes) - {"continuation", "fragments", "forwarded"} or not shapes:
        parser.error("--shapes: continuation, fragments, forwarded")
    if not 1 <= args.flood_s <= 600:
        parser.error("--flood-s must be in 1..600")
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    for name in ADDRESS_ENV:  # the image's defaults, no Space: plain `docker run -p`
        os.environ.pop(name, None)
    os.environ.update(image_env(args.server_repo))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; server from {args.server_repo}"
          f"{' with --web' if args.web else ''}")
    questions = load_questions(resolve_dataset("builtin").questions_path("train"))
    figures: dict = {"server_repo": str(args.server_repo), "web": args.web, "flood_s": args.flood_s,
                     "image_env": image_env(args.server_repo)}
    with server_process(args.server_repo, "sqlenv", args.web, 20.0) as server:
        for shape in shapes:
            started = time.monotonic()
            if shape == "forwarded":
                result = asyncio.run(shape_forwarded(server, questions))
            else:
                result = asyncio.run(shape_flood(server, questions, shape, args.flood_s))
            print(f"{shape} ({time.monotonic() - started:.0f} s): {json.dumps(result)}", flush=True)
            figures.update(result)
            server.wait_sessions(0, timeout=60)
        figures["server_alive"] = server.proc.poll() is None
    figures["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
