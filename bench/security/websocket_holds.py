"""What a few clients can hold on the server through its WebSockets (issue 49's shapes), and whether honest episodes
are still served meanwhile.

    python bench/security/websocket_holds.py [--shapes mcp,pings,shares,unread] [--ping-mb 500] [--ping-clients 1]
                                             [--ws sqlenv] [--web] [--server-repo DIR]

Starts `python -m sqlenv serve` on 127.0.0.1 (a free port, the default limits: 64 sessions, 16 per client, a 20 s
reset timeout, and a 20 s session timeout as the issue's probe had; stopped at the end) and plays each shape:

1. mcp: 64 silent WebSockets on OpenEnv's `/mcp` from one address (127.0.0.2), then 10 honest episodes on `/ws`
   from 127.0.0.1 while they are held: how many `/mcp` sockets were accepted and refused, the episodes served, and
   how long the accepted ones were kept; then four `/mcp` sockets each sending a 1.1 MB message of `{}`s (~369,000
   values) while `/health` is asked every 0.1 s: closed or answered, and `/health` at its slowest.
2. pings: `--ping-clients` clients (127.0.0.3, ...) each open `/ws` and send up to `--ping-mb` MB of 125-byte pings
   without reading anything (a client gives up when the server has taken nothing for 5 s): MB the server took,
   its RSS before, at its peak and after, `/health` at its slowest (from the flood until both ends below, or the
   wait's end), when the sessions ended and when the connections were gone (the clients' sockets no longer
   established: the server reset or closed them; the clients still read nothing).
3. shares: four addresses (127.0.0.11-14) each open 16 WebSockets that reset once and fall silent, then 10 honest
   episodes one after another from 127.0.0.1 and one from each of four new addresses at once: sessions each
   address got, episodes served.
4. unread: a client resets, asks for ~30 MB of replies (a 1,000,000-character ANSWER, then 30 `state`) and reads
   none: seconds from its last message until the server ended its session.

`--ws` picks the WebSocket implementation the server runs (`sqlenv`: SQLEnv's bounded protocol; `websockets-sansio`:
uvicorn's default, as before issue 49; `websockets`: uvicorn's deprecated legacy one; `all`: one server each, the
pings shape only, side by side): the server's `sqlenv.server.app.websocket_protocol` is replaced before it starts.
`--server-repo DIR` runs the server from another checkout (e.g. `git archive 7983944 | tar -x -C DIR`, with DIR's
`data/builtin` built) to measure before a change. The machine is shared: times are upper bounds. Prints, last line
one JSON object. The soak (`bench/security/soak.py`) makes the same shapes among its hostile sessions
(`mcp-silent`, `ping-flood`, `few-addresses`), with the coroutines here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess, Watch, rss_mb  # noqa: E402

from sqlenv.data.datasets import load_questions, resolve_dataset  # noqa: E402

MB = 1_000_000
#: A client's ping frame with the longest payload a control frame may carry (masked, with a zero key).
PING = bytes([0x89, 0x80 | 125]) + bytes(4) + b"p" * 125
PING_BLOCK = PING * 8192  # ~1 MB of whole frames
HANDSHAKE = ("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
WS_CHOICES = ("sqlenv", "websockets-sansio", "websockets")
#: Runs `python -m sqlenv` from a checkout (argv[1]) with a WebSocket implementation (argv[2]; "sqlenv": as it is).
LAUNCH = ("import runpy, sys\nrepo, ws = sys.argv.pop(1), sys.argv.pop(1)\nsys.path.insert(0, repo)\n"
          "if ws != 'sqlenv':\n    import sqlenv.server.app as app\n    app.websocket_protocol = lambda: ws\n"
          "runpy.run_module('sqlenv', run_name='__main__')")


# ------------------------------------------------------------------------------------------------ the shapes
async def raw_websocket(port: int, path: str, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket handshake to `path` from `source`, answered 101, nothing read after the reply's head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(HANDSHAKE.format(path=path).encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    if not head.startswith(b"HTTP/1.1 101"):
        writer.transport.abort()
        raise ConnectionError(f"handshake refused: {head[:40]!r}")
    return reader, writer


async def ping_flood(port: int, source: str, max_bytes: int, max_s: float, stall_s: float = 2.0) -> dict:
    """Pings on `/ws` from `source`, nothing read, until `max_bytes` went out, `max_s` passed, or the server took
    nothing for `stall_s`.
    Returns taken (bytes the client's kernel accepted; all written when the server ended the connection), stalled,
    ended (by the server, while flooding), flood_s, started, and the connection (reader, writer: the caller ends
    it)."""
    reader, writer = await raw_websocket(port, "/ws", source)
    writer.transport.set_write_buffer_limits(high=len(PING_BLOCK))
    started = time.monotonic()
    written, stalled, ended = 0, False, False
    try:
        while written < max_bytes and time.monotonic() - started < max_s:
            writer.write(PING_BLOCK)  # whole blocks of whole frames
            written += len(PING_BLOCK)
            try:
                await asyncio.wait_for(writer.drain(), stall_s)
            except asyncio.TimeoutError:
                stalled = True
                break
            except ConnectionError:  # the server ended the connection
                ended = True
                break
        taken = written - (0 if ended else writer.transport.get_write_buffer_size())
        flooded_s = time.monotonic() - started
        return {"taken": taken, "stalled": stalled, "ended": ended, "flood_s": flooded_s, "reader": reader,
                "writer": writer, "started": started}
    except BaseException:
        writer.transport.abort()
        raise


async def ws_connect(port: int, path: str, source: str, **kwargs):
    from websockets.asyncio.client import connect

    return await connect(f"ws://127.0.0.1:{port}{path}", proxy=None, compression=None, open_timeout=30,
                         max_size=None, local_addr=(source, 0), **kwargs)


async def first_message(ws, wait_s: float = 0.5) -> dict | None:
    """The server's first message, if one comes within `wait_s` (a refusal comes at once), else None."""
    try:
        return json.loads(await asyncio.wait_for(ws.recv(), wait_s))
    except (asyncio.TimeoutError, ValueError):
        return None
    except Exception:  # noqa: BLE001 - closed at once
        return {"type": "closed"}


def refused(message: dict | None) -> bool:
    return bool(message) and message.get("type") in ("error", "closed")


async def closed_within(ws, started: float, wait_s: float) -> float | None:
    """Seconds from `started` until the server closed `ws` (its messages read and dropped), None past `wait_s`."""
    from websockets.exceptions import ConnectionClosed

    deadline = started + wait_s
    try:
        while True:
            await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))
    except ConnectionClosed:
        return time.monotonic() - started
    except asyncio.TimeoutError:
        return None


async def try_reset(ws, data: dict | None = None) -> dict:
    """Reset; the reply (a refusal sent at once comes first, whatever was sent)."""
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        await ws.send(json.dumps({"type": "reset", "data": data or {}}))
    try:
        return json.loads(await asyncio.wait_for(ws.recv(), 60))
    except ConnectionClosed:
        return {"type": "closed"}


async def honest_episode(port: int, source: str, question) -> bool:
    """Reset to `question`, QUERY its gold SQL, ANSWER its gold answer: whether the episode ended correct."""
    from sqlenv.scoring.verifier import format_answer

    try:
        async with await ws_connect(port, "/ws", source) as ws:
            if (await try_reset(ws, {"question_id": question.question_id}))["type"] != "observation":
                return False
            reply: dict = {}
            for action_type, argument in (("QUERY", question.gold_sql),
                                          ("ANSWER", format_answer(question.gold_answer, question.answer_type))):
                await ws.send(json.dumps({"type": "step", "data": {"action_type": action_type,
                                                                    "argument": argument}}))
                reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
            observation = reply.get("data", {}).get("observation", {})
            return observation.get("metadata", {}).get("outcome") == "correct"
    except Exception:  # noqa: BLE001 - not served
        return False


async def hold_sockets(port: int, path: str, source: str, count: int, reset: bool) -> tuple[list, int, int]:
    """`count` WebSockets on `path` from `source`, opened one after another, then each reset once when `reset`
    (else given 1 s for a refusal): (the held ones, how many, how many refused)."""
    opened, refusals = [], 0
    for _ in range(count):
        try:
            opened.append(await ws_connect(port, path, source))
        except Exception:  # noqa: BLE001 - refused at the handshake
            refusals += 1
    replies = await asyncio.gather(*(try_reset(ws) if reset else first_message(ws, 1.0) for ws in opened))
    held = []
    for ws, reply in zip(opened, replies):
        if (reply or {}).get("type") in ("observation", None):
            held.append(ws)
        else:
            refusals += 1
            ws.transport.abort()
    return held, len(held), refusals


# ------------------------------------------------------------------------- the soak's attacks (soak.py)
# Each counts what it sent and what was refused in `tally` (soak.py's Tally), and any breach in `tally.breaches`.
#: The addresses that together would fill a server with their per-client shares (`few-addresses`).
FEW_ADDRESSES = ["127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24"]
MIB = 1024 * 1024


async def mcp_silent(port: int, source: str, count: int, reset_s: float, tally) -> None:
    """Issue 49: `count` silent WebSockets on OpenEnv's `/mcp` (which opens a session on connect, outside the old
    guard), each of which must be closed within the reset timeout (+ 5 s), and one sending a message of 1 MiB of
    `{}`s, which must close its connection unanswered: else a breach."""
    from websockets.exceptions import ConnectionClosed

    started = time.monotonic()
    sockets, _, refusals = await hold_sockets(port, "/mcp", source, count, reset=False)
    tally.requests += count + 1
    tally.hostile_refused += refusals
    try:
        ends = await asyncio.gather(*(closed_within(ws, started, reset_s + 5.0) for ws in sockets))
        tally.breaches += [f"an /mcp WebSocket kept {reset_s + 5.0:g} s" for end in ends if end is None]
        ws = await ws_connect(port, "/mcp", source)
        try:
            if await first_message(ws) is None:  # not refused at once
                await ws.send("[" + ",".join(["{}"] * (MIB // 3)) + "]")
                try:
                    await asyncio.wait_for(ws.recv(), 60)
                    tally.breaches.append("a message of {}s on /mcp was parsed and answered")
                except ConnectionClosed:
                    pass
        finally:
            ws.transport.abort()
    finally:
        for ws in sockets:
            ws.transport.abort()


async def ping_flood_attack(port: int, source: str, hold_s: float, tally) -> None:
    """Issue 49: pings on `/ws` from a client that reads nothing (up to 64 MiB, until the server takes nothing for
    2 s), then silence for `hold_s`: more than 32 MiB taken is a breach (the server kept every pong)."""
    try:
        flood = await ping_flood(port, source, 64 * MIB, 10.0)
    except (ConnectionError, OSError):  # refused (the address at its share), or closed meanwhile
        tally.hostile_refused += 1
        return
    try:
        if flood["taken"] > 32 * MIB:
            tally.breaches.append(f"{flood['taken'] / MIB:.0f} MiB of pings read from a client that reads nothing")
        await asyncio.sleep(hold_s)
    finally:
        flood["writer"].transport.abort()


#: One `few-addresses` attack at a time: two at once share the four addresses, and their newcomers compete.
_FEW_AT_ONCE = asyncio.Lock()
#: The free sessions before the four addresses that leave a newcomer room whatever else happens meanwhile: each
#: address takes at most half of what it finds (so 32 leave 2), and any other client's first session may take one.
FEW_ADDRESSES_ROOM = 32


async def few_addresses(port: int, newcomer: str, hold_s: float, tally) -> None:
    """Issue 49: four addresses each open 16 WebSockets that reset once and fall silent, held `hold_s`; meanwhile
    a new address (`newcomer`) resets. Refused when the server had at least `FEW_ADDRESSES_ROOM` sessions free
    before the four came, it is a breach (4 x 16 once took 64 of 64); with less room, each address's first
    session alone may take the last ones."""
    held: list = []
    async with _FEW_AT_ONCE:
        try:
            room = await asyncio.to_thread(free_sessions, port)
            for address in FEW_ADDRESSES:
                sockets, _, refusals = await hold_sockets(port, "/ws", address, 16, reset=True)
                held += sockets
                tally.requests += 16
                tally.hostile_refused += refusals
            ws = await ws_connect(port, "/ws", newcomer)
            try:
                reply = await try_reset(ws)
                if reply["type"] != "observation" and room >= FEW_ADDRESSES_ROOM:
                    tally.breaches.append(f"a new address refused beside four holding sessions ({room} were free "
                                          f"before them): {str(reply)[:120]}")
            finally:
                await ws.close()
            await asyncio.sleep(hold_s)
        finally:
            for ws in held:
                ws.transport.abort()


def free_sessions(port: int) -> int:
    """`GET /sessions`: the session limit minus the sessions open now."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/sessions")
        sessions = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return sessions["max"] - sessions["open"]


# ----------------------------------------------------------------------------------------------- the bench
async def shape_mcp(server: ServerProcess, questions: list, reset_s: float) -> dict:
    started = time.monotonic()
    sockets, accepted, refusals = await hold_sockets(server.port, "/mcp", "127.0.0.2", 64, reset=False)
    served = await asyncio.gather(*(honest_episode(server.port, "127.0.0.1", q) for q in questions[:10]))
    ends = await asyncio.gather(*(closed_within(ws, started, reset_s + 30) for ws in sockets))
    for ws in sockets:
        ws.transport.abort()
    outcomes: list[str] = []

    async def many_values() -> None:
        from websockets.exceptions import ConnectionClosed

        async with await ws_connect(server.port, "/mcp", "127.0.0.5") as ws:
            await ws.send("[" + ",".join(["{}"] * 369_000) + "]")
            try:
                await asyncio.wait_for(ws.recv(), 30)
                outcomes.append("answered")
            except ConnectionClosed:
                outcomes.append("closed")
            except asyncio.TimeoutError:
                outcomes.append("no reply in 30 s")

    with Watch(server.port, server.proc.pid) as watch:
        await asyncio.gather(*(many_values() for _ in range(4)))
    return {"mcp_sockets": 64, "mcp_accepted": accepted, "mcp_refused": refusals,
            "mcp_honest_served": f"{sum(served)} of {len(served)}",
            "mcp_kept_max_s": round(max((e for e in ends if e is not None), default=0.0), 1),
            "mcp_kept_past_wait": sum(e is None for e in ends), "mcp_values_outcomes": outcomes,
            "mcp_values_health_max_s": watch.health_max_s}


def established(sockname: tuple) -> bool:
    """Whether the kernel still holds this client socket (`sockname`: its local address) ESTABLISHED: a server that
    ended the connection sent a reset (or a FIN), which the client's kernel takes without the client reading."""
    host, port = sockname[:2]
    local = f"{int.from_bytes(bytes(map(int, host.split('.'))), 'little'):08X}:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local:
            return fields[3] == "01"
    return False


async def shape_pings(server: ServerProcess, ping_mb: float, clients: int, wait_s: float) -> dict:
    pid = server.proc.pid
    before = rss_mb(pid)
    with Watch(server.port, pid) as watch:
        floods = await asyncio.gather(*(ping_flood(server.port, f"127.0.0.{3 + i}", int(ping_mb * MB), 120.0, 5.0)
                                        for i in range(clients)))
        held = rss_mb(pid)
        session_end = connection_end = None
        started = min(f["started"] for f in floods)
        names = [f["writer"].get_extra_info("sockname") for f in floods]
        while time.monotonic() - started < wait_s and None in (session_end, connection_end):  # still unread
            if session_end is None and server.sessions()["open"] == 0:
                session_end = time.monotonic() - started
            if connection_end is None and not any(established(name) for name in names):
                connection_end = time.monotonic() - started
            await asyncio.sleep(0.2)
    for flood in floods:
        flood["writer"].transport.abort()
    return {"ping_clients": clients, "ping_mb_offered": ping_mb,
            "ping_mb_taken": [round(f["taken"] / MB, 1) for f in floods],
            "ping_flood_s": round(max(f["flood_s"] for f in floods), 1),
            "ping_ended_by_server": [f["ended"] for f in floods], "ping_stalled": [f["stalled"] for f in floods],
            "ping_rss_before_mb": round(before), "ping_rss_held_mb": round(held),
            "ping_rss_peak_mb": round(watch.rss_peak), "ping_rss_growth_mb": round(watch.rss_peak - before),
            "ping_health_max_s": watch.health_max_s,
            "ping_session_end_s": None if session_end is None else round(session_end, 1),
            "ping_connection_end_s": None if connection_end is None else round(connection_end, 1)}


async def shape_shares(server: ServerProcess, questions: list) -> dict:
    held_by: list[int] = []
    sockets: list = []
    for i in range(4):
        got, held, _ = await hold_sockets(server.port, "/ws", f"127.0.0.{11 + i}", 16, reset=True)
        sockets += got
        held_by.append(held)
    own = [await honest_episode(server.port, "127.0.0.1", q) for q in questions[:10]]  # a visitor's, in turn
    new = await asyncio.gather(*(honest_episode(server.port, f"127.0.0.{21 + i}", q)
                                 for i, q in enumerate(questions[10:14])))
    for ws in sockets:
        ws.transport.abort()
    return {"shares_held": held_by, "shares_honest_served": f"{sum(own)} of {len(own)}",
            "shares_newcomers_served": f"{sum(new)} of {len(new)}"}


async def shape_unread(server: ServerProcess, wait_s: float) -> dict:
    # It stops reading once a reply waits, and sends no keepalive pings (which a server that stopped reading
    # leaves unanswered, and the client library then closes the connection itself).
    ws = await ws_connect(server.port, "/ws", "127.0.0.6", max_queue=1, ping_interval=None)
    try:
        await ws.send(json.dumps({"type": "reset", "data": {}}))
        await ws.send(json.dumps({"type": "step", "data": {"action_type": "ANSWER", "argument": "7" * MB}}))
        for _ in range(30):
            await ws.send(json.dumps({"type": "state"}))
        last = time.monotonic()
        while server.sessions()["open"] == 0 and time.monotonic() - last < 10.0:
            await asyncio.sleep(0.05)  # its session is opened on a thread of the server's
        while time.monotonic() - last < wait_s:
            if server.sessions()["open"] == 0:
                return {"unread_session_end_s": round(time.monotonic() - last, 1)}
            await asyncio.sleep(0.2)
        return {"unread_session_end_s": None, "unread_still_open_at_s": wait_s}
    finally:
        ws.transport.abort()


def server_process(repo: Path, ws: str, web: bool, session_s: float) -> ServerProcess:
    serve_args = ["serve", "--dataset", "builtin", "--split", "train", "--host", "127.0.0.1", "--port", "{port}",
                  "--session-timeout", f"{session_s:g}", *(["--web"] if web else [])]
    return ServerProcess(command=[sys.executable, "-c", LAUNCH, str(repo.resolve()), ws, *serve_args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="mcp,pings,shares,unread", help="comma-separated (default all four)")
    parser.add_argument("--ping-mb", type=float, default=500.0, help="MB of pings each client offers (default 500)")
    parser.add_argument("--ping-clients", type=int, default=1, help="clients flooding at once (default 1)")
    parser.add_argument("--ws", default="sqlenv", choices=[*WS_CHOICES, "all"],
                        help="the server's WebSocket implementation (default sqlenv; all: pings on each)")
    parser.add_argument("--web", action="store_true", help="start the server with --web, as the Dockerfile does")
    parser.add_argument("--server-repo", type=Path, default=REPO, help="the checkout whose `sqlenv` the server runs")
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if set(shapes) - {"mcp", "pings", "shares", "unread"} or not shapes:
        parser.error("--shapes: mcp, pings, shares, unread")
    if not 0 < args.ping_mb <= 2000 or not 1 <= args.ping_clients <= 8:
        parser.error("--ping-mb must be in (0, 2000], --ping-clients in 1..8")
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    session_s, reset_s = 20.0, 20.0
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; server from {args.server_repo}; "
          f"session and reset timeouts {session_s:g} s")
    questions = load_questions(resolve_dataset("builtin").questions_path("train"))
    figures: dict = {"server_repo": str(args.server_repo), "web": args.web}
    wait_s = reset_s + 40.0
    for ws in (WS_CHOICES if args.ws == "all" else (args.ws,)):
        with server_process(args.server_repo, ws, args.web, session_s) as server:
            for shape in (["pings"] if args.ws == "all" else shapes):
                started = time.monotonic()
                if shape == "mcp":
                    result = asyncio.run(shape_mcp(server, questions, reset_s))
                elif shape == "pings":
                    result = asyncio.run(shape_pings(server, args.ping_mb, args.ping_clients, wait_s))
                elif shape == "shares":
                    result = asyncio.run(shape_shares(server, questions))
                else:
                    result = asyncio.run(shape_unread(server, wait_s))
                result = {f"{ws}:{k}" if args.ws == "all" else k: v for k, v in result.items()}
                print(f"{shape} ({ws}, {time.monotonic() - started:.0f} s): {json.dumps(result)}", flush=True)
                figures.update(result)
                server.wait_sessions(0, timeout=wait_s)
            figures[f"{ws}:server_alive" if args.ws == "all" else "server_alive"] = server.proc.poll() is None
    figures["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
