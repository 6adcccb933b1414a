"""Soak: a real server under honest and hostile sessions at once, for a bounded time (issues 20 and 26).

    python bench/soak.py [--duration 600] [--honest 64] [--hostile 64] [--dataset builtin]

Starts `python -m sqlenv serve` on 127.0.0.1 (a free port, room for every session; stopped at the end). In one
asyncio loop, `--honest` sessions (`SQLEnvClient`) play oracle episodes back to back, and `--hostile` sessions
(raw WebSocket frames) keep attacking: costly SQL (quadratic `instr` over the longest values allowed, sorts of
random blobs, runaway recursive CTEs, huge cross joins, deep nesting), malformed and unknown frames, abrupt
disconnects and reconnects, HTTP `openenv/session/create` on `/mcp` (plain, and spelled with JSON escapes, in
UTF-16 or in a batch), oversized HTTP bodies, half-sent requests (part of a head, or a head and part of a body,
then silence), resets with a 1 MB `question_id`, idle pauses; and issue 35's shapes: a query cheap with DISTINCT
and costly without it, then ANSWER, then `state` (EX re-runs the query without DISTINCT); an ANSWER of a code
fence and ~28,000 newlines; one row of `trim(x, y)` calls and of GLOB character classes over the longest
values; WebSockets that connect and never send anything. The hostile sessions connect from 127.0.0.2, the
honest ones from 127.0.0.1, so the server's per-client limit holds the attackers to their share. A watcher asks
`/health` every 0.25 s (its longest wait is a figure) and samples the server's RSS.

Prints, last line one JSON object: requests (steps and calls sent), honest_errors (exceptions, error frames and
oracle episodes not correct in honest sessions: must be 0), hostile_errors (exceptions a hostile session met;
refusals are its normal fate), breaches (hostile requests that got what the server must refuse: a session
opened over HTTP, a half-sent request's connection kept past the request timeout + 5 s, a value sent back
whole, a never-reset WebSocket kept past the reset timeout + 5 s: must be 0), max_step_s (the longest reply to a
step or `state`, honest or hostile, measured by the client: must be <= the 5 s limit + 1 s), max_honest_step_s and
max_health_s (the longest an honest step and `/health` waited: must be <= 1 s, whatever the hostile sessions do),
health_failures, sessions_leaked (open after every client left), rss_growth_mb (server RSS at rest after the soak
minus after the warm-up: must be <= 100), hostile_shapes (attacks made, by shape), and client_max_stall_s (the
longest the bench's own event loop was late: a reply that arrives while it stalls is timed that much longer).
Bounded: `--duration` (at most 3600 s) and `--max-requests`. The machine is shared: times are upper bounds.

Client and server share the machine, so the client is built not to stall: after the warm-up its objects are frozen
out of the garbage collector's full passes (as the server's are), which on a loaded machine took up to 0.95 s and
added that much to every reply timed across them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess, get_json  # noqa: E402

from sqlenv.data.datasets import load_questions, resolve_dataset  # noqa: E402
from sqlenv.evaluation.policies import OraclePolicy  # noqa: E402
from sqlenv.server.client import SQLEnvClient  # noqa: E402
from sqlenv.server.app import DEFAULT_REQUEST_TIMEOUT_S as REQUEST_TIMEOUT_S, TRIM_INTERVAL_S  # noqa: E402
from sqlenv.server.app import DEFAULT_RESET_TIMEOUT_S as RESET_TIMEOUT_S  # noqa: E402
from sqlenv.server.models import SQLAction as WireAction  # noqa: E402

STEP_LIMIT_S = 5.0  # the server's default SQL time limit (SandboxSettings.timeout_s)
HOSTILE_ADDRESS = "127.0.0.2"
HEALTH_EVERY_S = 0.25  # where the hostile sessions connect from (any of 127/8 reaches a loopback server)

_A = "replace(hex(zeroblob({n})), '0', 'a')"
HOSTILE_SQL = [
    # Quadratic instr over the longest values allowed, many calls per row, row after row.
    "WITH s(a, b) AS (SELECT " + _A.format(n=3300) + ", " + _A.format(n=1600) + " || 'b'), "
    "r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT " + ", ".join(["instr(a, b)"] * 300) + " FROM s, r",
    # The probe's finding: two instr calls over ~500 KB strings (now refused: too big).
    "SELECT instr(" + _A.format(n=250_000) + ", " + _A.format(n=125_000) + " || 'b'), instr("
    + _A.format(n=250_000) + ", " + _A.format(n=125_000) + " || 'b')",
    # A sort of random blobs: temporary storage (in memory under the heap limit, no file).
    "WITH RECURSIVE r(n, b) AS (SELECT 1, randomblob(9000) UNION ALL SELECT n + 1, randomblob(9000) FROM r) "
    "SELECT n FROM r ORDER BY b",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT group_concat(n) FROM r",
    "SELECT count(*) FROM (SELECT 1 UNION ALL SELECT 2) a, (SELECT 1 UNION ALL SELECT 2) b, sqlite_master c, "
    "(WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 100000) SELECT n FROM r) d, "
    "(WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 100000) SELECT n FROM r) e",
    "SELECT " + "(" * 2000 + "1" + ")" * 2000,
    " UNION ".join(["SELECT 1"] * 200),
    "SELECT zeroblob(1000000000)",
    "SELECT printf('%.900000000c', 'x')",
    "DELETE FROM sqlite_master",
    "ATTACH DATABASE '/tmp/soak.db' AS x",
    "SELECT 1; DROP TABLE x",
    "SELECT '" + "x" * 19_000 + "'",
    # Issue 35: one row of calls whose cost is the product of their arguments' lengths, with no jump between
    # them (SQLite checks its interrupt there only): trim with a character set, GLOB with a character class.
    "WITH s(x, y) AS (SELECT " + _A.format(n=4500) + ", " + _A.format(n=410).replace("'a'", "'b'") + " || 'a') "
    "SELECT " + ", ".join(["trim(x, y)"] * 800) + " FROM s",
    "WITH s(x, p) AS (SELECT " + _A.format(n=4500) + ", '*[' || " + _A.format(n=240).replace("'a'", "'b'")
    + " || 'a]c') SELECT " + ", ".join(["x GLOB p"] * 800) + " FROM s",
]
#: Issue 35: cheap as sent (DISTINCT keeps each side at 3 rows), a 3000^3-row cross join once DISTINCT is removed,
#: as the official EX does when it re-runs the last query after ANSWER.
_THREES = "(SELECT DISTINCT n % 3 AS j FROM r)"
DISTINCT_EX_SQL = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 3000) "
                   f"SELECT count(DISTINCT a.j) FROM {_THREES} a, {_THREES} b, {_THREES} c")
#: Issue 35: a code fence and ~28 KB of newlines, which a backtracking answer pattern took 17 s over.
FENCE_ANSWER = "```" + "\n" * 28_000
#: `openenv/session/create` as OpenEnv reads it (JSON-parsed) but not as the bytes read: each must be refused.
_CREATE = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
SESSION_CREATE_BODIES = [
    json.dumps(_CREATE).encode(),
    json.dumps(_CREATE).replace("/", "\\/").encode(),  # "openenv\/session\/create"
    json.dumps(_CREATE).replace("create", "\\u0063reate").encode(),
    json.dumps(_CREATE).encode("utf-16"),
    json.dumps([{**_CREATE, "method": "tools/list"}, _CREATE]).encode(),
]
#: Requests that stop half-way: part of a head, or a head and part of its declared body.
HALF_SENT = [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b"",
             b"POST /step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n{\"action\": "]
GARBAGE_FRAMES = ['{"type": "step", "data": {"action_type": "QUERY"}}', '{"type": "bogus"}', "not json", "{" * 10_000,
                  '{"type": "reset", "data": {"seed": "x"}}', '{"type": "step", "data": 5}', "[]", "null"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.honest_steps = 0
        self.honest_episodes = 0
        self.honest_errors: list[str] = []
        self.hostile_errors: list[str] = []
        self.breaches: list[str] = []
        self.hostile_refused = 0
        self.max_step_s = {"honest": 0.0, "hostile": 0.0}
        self.slowest = ""
        self.health_failures = 0
        self.max_health_s = 0.0
        self.client_max_stall_s = 0.0
        self.shapes: dict[str, int] = {}  # attacks made, by shape

    def made(self, shape: str) -> None:
        self.shapes[shape] = self.shapes.get(shape, 0) + 1

    def step_time(self, who: str, seconds: float, what: str) -> None:
        if seconds > self.max_step_s[who]:
            self.max_step_s[who] = seconds
            if seconds >= max(self.max_step_s.values()):
                self.slowest = f"{who}: {what[:120]}"


async def honest(client: SQLEnvClient, plan, index: int, deadline: float, budget: "Budget", tally: Tally) -> None:
    """Oracle episodes on one session until `deadline`: the questions of `plan` (a list, or a random draw)."""
    rng = random.Random(index)
    pending = list(plan) if isinstance(plan, list) else None
    while time.monotonic() < deadline and budget.take():
        if pending is not None and not pending:
            return
        question = pending.pop() if pending is not None else rng.choice(plan[0])
        try:
            result = await client.reset(question_id=question.question_id)
            tally.requests += 1
            observation = result.observation.to_core()
            policy = OraclePolicy()
            seat = type("Seat", (), {"question": question})()
            policy.reset(seat, observation)
            while not observation.done:
                action = policy.act(seat, observation)
                started = time.monotonic()
                result = await client.step(WireAction.from_core(action))
                tally.step_time("honest", time.monotonic() - started, f"{action.action_type} {action.argument}")
                tally.requests += 1
                tally.honest_steps += 1
                observation = result.observation.to_core()
            tally.honest_episodes += 1
            if result.observation.metadata.get("outcome") != "correct":
                tally.honest_errors.append(f"honest {index}: {question.question_id} ended "
                                           f"{result.observation.metadata.get('outcome')}")
        except Exception as exc:  # noqa: BLE001 - the figure is "0 honest errors"
            tally.honest_errors.append(f"honest {index}: {type(exc).__name__}: {str(exc)[:200]}")
            return


def _http(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """(status, the first 100 KB of the reply); status 0 when the connection failed."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(100_000)
    except urllib.error.HTTPError as err:
        return err.code, err.read(100_000)
    except (urllib.error.URLError, ConnectionError):
        return 0, b""


async def half_sent(port: int, prefixes: list[bytes], tally: Tally) -> None:
    """Open a connection per prefix, send it and fall silent; each must be closed by the server within its
    request timeout (+ 5 s on a loaded machine), or it is a breach."""
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in prefixes]
    for (_, writer), prefix in zip(streams, prefixes):
        writer.write(prefix)
    for (reader, writer), prefix in zip(streams, prefixes):
        try:
            while await asyncio.wait_for(reader.read(65536), REQUEST_TIMEOUT_S + 5.0):
                pass  # a 408 before the close
            tally.hostile_refused += 1
        except asyncio.TimeoutError:
            tally.breaches.append(f"half-sent request held open: {prefix[:60]!r}")
        except ConnectionError:
            tally.hostile_refused += 1
        finally:
            writer.close()


def _step(action_type: str, argument: str) -> str:
    return json.dumps({"type": "step", "data": {"action_type": action_type, "argument": argument}})


async def never_reset(port: int, count: int, tally: Tally) -> None:
    """Open `count` WebSockets from the hostile address and send nothing: each must be closed by the server within
    its reset timeout (+ 5 s on a loaded machine), or it is a breach. One over the per-client limit is refused at
    once (`CAPACITY_REACHED`, then closed)."""
    from websockets.asyncio.client import connect

    opened = []
    try:
        for _ in range(count):
            opened.append(await connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None, open_timeout=30,
                                        local_addr=(HOSTILE_ADDRESS, 0)))
        tally.requests += count
        started = time.monotonic()
        for ws in opened:
            left = RESET_TIMEOUT_S + 5.0 - (time.monotonic() - started)
            try:
                await asyncio.wait_for(ws.wait_closed(), max(0.1, left))
                tally.hostile_refused += 1
            except asyncio.TimeoutError:
                tally.breaches.append(f"a WebSocket that never reset was kept {RESET_TIMEOUT_S + 5.0:g} s")
    finally:
        for ws in opened:
            ws.transport.abort()


async def hostile(url: str, port: int, index: int, deadline: float, budget: "Budget", tally: Tally) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    rng = random.Random(10_000 + index)
    while time.monotonic() < deadline and budget.take():
        attack = rng.random()
        try:
            if attack < 0.05:  # sessions over HTTP, however spelled (refused), and an oversized body (413)
                status, reply = await asyncio.to_thread(_http, url + "/mcp", rng.choice(SESSION_CREATE_BODIES))
                if status == 200 and b'"result"' in reply:
                    tally.breaches.append(f"session opened over HTTP /mcp: {reply[:120]!r}")
                await asyncio.to_thread(_http, url + "/step", b" " * (2 * 1024 * 1024))
                tally.requests += 2
                tally.hostile_refused += 2
                continue
            if attack < 0.07:  # requests that stop half-way, a few at once
                await half_sent(port, [rng.choice(HALF_SENT) for _ in range(rng.randint(1, 5))], tally)
                tally.requests += 1
                continue
            if attack < 0.10:  # WebSockets that never send anything: closed at the reset timeout
                tally.made("never-reset sockets")
                await never_reset(port, rng.randint(1, 4), tally)
                continue
            async with connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None, open_timeout=30,
                               max_size=None, local_addr=(HOSTILE_ADDRESS, 0)) as ws:

                async def timed(frame: str, what: str) -> str:
                    started = time.monotonic()
                    await ws.send(frame)
                    reply = await asyncio.wait_for(ws.recv(), 60)
                    tally.step_time("hostile", time.monotonic() - started, what)
                    tally.requests += 1
                    return reply

                if attack < 0.12:  # a 1 MB question_id: refused, and not sent back
                    await ws.send(json.dumps({"type": "reset", "data": {"question_id": "q" * 1_000_000}}))
                    reply = await asyncio.wait_for(ws.recv(), 60)
                    tally.requests += 1
                    tally.hostile_refused += 1
                    if len(reply) > 10_000:
                        tally.breaches.append(f"a 1 MB question_id sent back ({len(reply):,} characters)")
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                await asyncio.wait_for(ws.recv(), 60)
                tally.requests += 1
                if attack < 0.17:  # cheap with DISTINCT, then ANSWER (EX re-runs it without), then `state`
                    tally.made("DISTINCT query, ANSWER, state")
                    await timed(_step("QUERY", DISTINCT_EX_SQL), "QUERY " + DISTINCT_EX_SQL)
                    await timed(_step("ANSWER", "3"), "ANSWER after the DISTINCT query")
                    await timed(json.dumps({"type": "state"}), "state after the DISTINCT query's ANSWER")
                elif attack < 0.21:  # a code fence and ~28 KB of newlines
                    tally.made("fence + newlines ANSWER")
                    await timed(_step("ANSWER", FENCE_ANSWER), "ANSWER ``` + 28,000 newlines")
                for _ in range(rng.randint(1, 8) if attack >= 0.21 else 0):
                    if time.monotonic() > deadline:
                        break
                    kind = rng.random()
                    if kind < 0.6:
                        sql = rng.choice(HOSTILE_SQL)
                        frame = _step("QUERY", sql)
                        tally.made("trim/GLOB row" if "trim(x, y)" in sql or "GLOB p" in sql else "costly SQL")
                    elif kind < 0.9:
                        sql = frame = rng.choice(GARBAGE_FRAMES)
                    else:
                        await asyncio.sleep(rng.uniform(0.5, 3.0))  # idle
                        continue
                    await timed(frame, sql)
                if rng.random() < 0.3:
                    ws.transport.abort()  # drop the TCP connection without a close frame
        except InvalidStatus:
            tally.hostile_refused += 1  # capacity reached while dropped sessions are released
            await asyncio.sleep(0.5)
        except ConnectionClosed:
            tally.hostile_refused += 1
        except Exception as exc:  # noqa: BLE001 - counted; a hostile session's errors are not a failure
            tally.hostile_errors.append(f"hostile {index}: {type(exc).__name__}: {str(exc)[:200]}")


class Budget:
    """At most `limit` episodes / attack rounds in all: the soak is bounded in count as well as in time."""

    def __init__(self, limit: int):
        self.left = limit

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


async def loop_stalls(deadline: float, tally: Tally, tick_s: float = 0.01) -> None:
    """How late this client's event loop wakes from a `tick_s` sleep: the part of a step time that is the client's."""
    while time.monotonic() < deadline:
        started = time.monotonic()
        await asyncio.sleep(tick_s)
        tally.client_max_stall_s = max(tally.client_max_stall_s, time.monotonic() - started - tick_s)


def _timed_health(url: str) -> tuple[bool, float]:
    """(healthy, seconds) of one `/health` call, timed in the calling thread (not across the client's loop)."""
    started = time.monotonic()
    try:
        healthy = get_json(url + "/health", 10.0).get("status") == "healthy"
    except Exception:  # noqa: BLE001 - a failure is a figure
        healthy = False
    return healthy, time.monotonic() - started


async def watch(url: str, pid: int, deadline: float, tally: Tally, rss: list) -> None:
    """`/health` every `HEALTH_EVERY_S` (its longest wait is `max_health_s`), the server's RSS every 2 s."""
    next_rss = 0.0
    while time.monotonic() < deadline:
        healthy, seconds = await asyncio.to_thread(_timed_health, url)
        tally.health_failures += not healthy
        tally.max_health_s = max(tally.max_health_s, seconds)
        if time.monotonic() >= next_rss:
            rss.append(_rss_mb(pid))
            next_rss = time.monotonic() + 2.0
        await asyncio.sleep(HEALTH_EVERY_S)


async def soak(server: ServerProcess, questions: list, args: argparse.Namespace, tally: Tally) -> dict:
    """Warm up, then soak. The honest sessions stay open throughout (as a trainer's do); in the warm-up each
    plays one episode per database while every hostile session attacks twice, so the RSS measured after it
    includes the caches and the allocator's high-water mark that the attack mix reaches; growth past it is a
    leak."""
    rss: list[float] = []
    warm = Tally()
    per_database = list({q.database_name: q for q in questions}.values())
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(SQLEnvClient(base_url=server.url, message_timeout_s=120.0))
                   for _ in range(args.honest)]
        warm_deadline = time.monotonic() + 300.0
        await asyncio.gather(*(honest(c, list(per_database), i, warm_deadline, Budget(10_000), warm)
                               for i, c in enumerate(clients)),
                             *(hostile(server.url, server.port, i, time.monotonic() + 60.0, Budget(2), warm)
                               for i in range(args.hostile)))
        await asyncio.to_thread(server.wait_sessions, args.honest, 30.0)
        rss_after_warmup = _rss_mb(server.proc.pid)
        gc.collect()
        gc.freeze()  # the clients, questions and libraries live to the end: keep them out of full collections
        deadline = time.monotonic() + args.duration
        budget = Budget(args.max_requests)
        await asyncio.gather(watch(server.url, server.proc.pid, deadline, tally, rss), loop_stalls(deadline, tally),
                             *(honest(c, (questions,), i, deadline, budget, tally) for i, c in enumerate(clients)),
                             *(hostile(server.url, server.port, i, deadline, budget, tally)
                               for i in range(args.hostile)))
    return {"rss_after_warmup": rss_after_warmup, "rss_samples": rss, "warmup_errors": warm.honest_errors,
            "warmup_breaches": warm.breaches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of soak (default 600, at most 3600)")
    parser.add_argument("--honest", type=int, default=64, help="honest sessions (default 64)")
    parser.add_argument("--hostile", type=int, default=64, help="hostile sessions (default 64)")
    parser.add_argument("--dataset", default="builtin", help="dataset served (default builtin)")
    parser.add_argument("--max-requests", type=int, default=1_000_000,
                        help="most episodes and attack rounds in all (default 1,000,000)")
    args = parser.parse_args()
    if not 0 < args.duration <= 3600 or not 0 <= args.honest <= 128 or not 0 <= args.hostile <= 128:
        parser.error("--duration must be in (0, 3600], --honest and --hostile in 0..128")

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; soak {args.duration:g} s, "
          f"{args.honest} honest + {args.hostile} hostile sessions")
    info = resolve_dataset(args.dataset)
    questions = load_questions(info.questions_path("train"))
    # The honest sessions (127.0.0.1) fit their address's limit; the hostile ones (127.0.0.2) share theirs with
    # their never-reset sockets, and together can never fill the server.
    per_client = max(args.honest, 16)
    server = ServerProcess(["--dataset", str(info.root), "--split", "train", "--max-sessions-per-client",
                            str(per_client), "--max-sessions", str(args.honest + per_client + 8)]).start()
    tally = Tally()
    try:
        rss_start = _rss_mb(server.proc.pid)
        extra = asyncio.run(soak(server, questions, args, tally))
        sessions_leaked = server.wait_sessions(0, timeout=30)
        time.sleep(TRIM_INTERVAL_S + 2.0)  # at rest: the server has released what the last sessions held
        rss_end = _rss_mb(server.proc.pid)
        alive = server.proc.poll() is None
    finally:
        server.stop()
    honest_errors = len(tally.honest_errors) + len(extra["warmup_errors"])
    for line in (extra["warmup_errors"] + tally.honest_errors)[:5]:
        print("  honest error:", line)
    for line in tally.hostile_errors[:5]:
        print("  hostile error:", line)
    breaches = extra["warmup_breaches"] + tally.breaches
    for line in breaches[:5]:
        print("  breach:", line)
    max_step = max(tally.max_step_s.values())
    print(f"requests {tally.requests}, honest episodes {tally.honest_episodes} ({tally.honest_steps} steps), "
          f"honest errors {honest_errors}, hostile errors {len(tally.hostile_errors)}, refused {tally.hostile_refused}, "
          f"breaches {len(breaches)}")
    print(f"max step time {max_step:.2f} s (honest {tally.max_step_s['honest']:.2f}, hostile "
          f"{tally.max_step_s['hostile']:.2f}; slowest {tally.slowest!r}); limit {STEP_LIMIT_S:g} s + 1 s; "
          f"the client's own longest stall {tally.client_max_stall_s:.2f} s")
    print("hostile shapes made: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.shapes.items())))
    print(f"longest waits (target <= 1 s): an honest step {tally.max_step_s['honest']:.2f} s, /health "
          f"{tally.max_health_s:.2f} s (asked every {HEALTH_EVERY_S:g} s)")
    curve = extra["rss_samples"][:: max(1, len(extra["rss_samples"]) // 12)]
    print("RSS MB every ~" + f"{args.duration / max(1, len(curve)):.0f} s: " + " ".join(f"{v:.0f}" for v in curve))
    print(f"RSS MB: start {rss_start:.0f}, after warm-up {extra['rss_after_warmup']:.0f}, peak "
          f"{max(extra['rss_samples'], default=float('nan')):.0f}, end {rss_end:.0f}; sessions leaked "
          f"{sessions_leaked}; health failures {tally.health_failures}; load average {os.getloadavg()[0]:.2f}")
    print(json.dumps({
        "duration_s": args.duration, "honest_sessions": args.honest, "hostile_sessions": args.hostile,
        "requests": tally.requests, "honest_episodes": tally.honest_episodes, "honest_errors": honest_errors,
        "hostile_errors": len(tally.hostile_errors), "hostile_refused": tally.hostile_refused,
        "breaches": len(breaches),
        "max_step_s": round(max_step, 3), "max_honest_step_s": round(tally.max_step_s["honest"], 3),
        "max_hostile_step_s": round(tally.max_step_s["hostile"], 3), "step_limit_s": STEP_LIMIT_S,
        "client_max_stall_s": round(tally.client_max_stall_s, 3), "max_health_s": round(tally.max_health_s, 3),
        "health_failures": tally.health_failures, "sessions_leaked": sessions_leaked, "server_alive": alive,
        "rss_start_mb": round(rss_start, 1), "rss_after_warmup_mb": round(extra["rss_after_warmup"], 1),
        "rss_peak_mb": round(max(extra["rss_samples"], default=float("nan")), 1), "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(rss_end - extra["rss_after_warmup"], 1), "hostile_shapes": tally.shapes,
        "load_average_1m_end": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
