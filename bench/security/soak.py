"""Soak: a real server under honest and hostile sessions at once, for a bounded time (issues 20 and 26).

    python bench/security/soak.py [--duration 600] [--honest 64] [--hostile 64] [--dataset builtin] [--shapes all]
                         [--python-slots N] [--server-args "..."] [--web]

Starts `python -m sqlenv serve` on 127.0.0.1 (a free port, room for every session; stopped at the end). In one
asyncio loop, `--honest` sessions (`SQLEnvClient`) play oracle episodes back to back, and `--hostile` sessions
(raw WebSocket frames) keep attacking: costly SQL (quadratic `instr` over the longest values allowed, sorts of
random blobs, runaway recursive CTEs, huge cross joins, deep nesting), malformed and unknown frames, abrupt
disconnects and reconnects, HTTP `openenv/session/create` on `/mcp` (plain, and spelled with JSON escapes, in
UTF-16 or in a batch), oversized HTTP bodies, half-sent requests (part of a head, or a head and part of a body,
then silence), resets with a 1 MB `question_id`, idle pauses; and issue 35's shapes: a query cheap with DISTINCT
and costly without it, then ANSWER, then `state` (EX re-runs the query without DISTINCT); an ANSWER of a code
fence and ~28,000 newlines; one row of `trim(x, y)` calls and of GLOB character classes over the longest
values; WebSockets that connect and never send anything; and issue 43's: distinct wide select lists on three
databases, then idle (prepared statements held on SQLite's shared heap: `statement-fill`); rows as wide and long as
the limits allow, and the issue's 1,990 columns (`wide-rows`); a query that takes seconds to prepare, and an episode
whose last step runs to its time limit after a query cheap only with DISTINCT (EX's rerun left no time:
`prepare-ex`); a WebSocket handshake to OpenEnv's UI socket `/ws/ui` and a session that asks for ~30 MB of replies,
neither ever read (`no-read`), uploads and 1 MB steps to OpenEnv's web routes under `/web` (`web-routes`), messages
of 1 MiB and 16 MiB of `{}`s (`many-values`); and issue 49's: silent WebSockets on OpenEnv's `/mcp` and one sending
1 MiB of `{}`s there (`mcp-silent`), a client sending pings and reading nothing (`ping-flood`), four more addresses
each opening 16 sessions that reset once and fall silent while a new address asks for one (`few-addresses`; the
coroutines are `bench/security/websocket_holds.py`'s); and issue 59's: a client that begins a message and sends empty
continuation frames (`continuation-flood`), one sending a 1 MB message in 1-byte fragments (`fragments`), one address
opening 64 sessions each naming another in `X-Forwarded-For` (`forwarded-for`; the coroutines are
`bench/security/frame_floods.py`'s). `--web` starts the server as the Dockerfile does, with its
page. The hostile sessions connect from 127.0.0.2 (`few-addresses` from 127.0.0.21-24 too), the honest ones from
127.0.0.1, so the server's per-client limit holds the attackers to their share. A watcher asks `/health` every 0.25 s (its longest wait is a figure) and samples the
server's RSS.

Prints, last line one JSON object: requests (steps and calls sent), honest_errors (exceptions, error frames and
oracle episodes not correct in honest sessions: must be 0), hostile_errors (exceptions a hostile session met;
refusals are its normal fate), breaches (hostile requests that got what the server must refuse: a session
opened over HTTP, a half-sent request's connection kept past the request timeout + 5 s, a value sent back
whole, a never-reset WebSocket kept past the reset timeout + 5 s, a UI socket accepted, an upload or a step taken
under `/web`, a message of `{}`s parsed and answered, an `/mcp` socket kept past the reset timeout + 5 s, more than
32 MiB of pings read from a client that reads nothing, a new address refused while four others hold their
sessions (when 32 or more were free before them), a flood of fragments kept unread instead of ended, more than 16
sessions from one address naming others in `X-Forwarded-For`: must be 0), max_step_s (the longest reply to a
step or `state`, honest or hostile, measured by the client: must be <= the 5 s limit + 1 s), max_honest_step_s and
max_health_s (the longest an honest step and `/health` waited: must be <= 1 s, whatever the hostile sessions do),
health_failures, sessions_leaked (open after every client left), rss_growth_mb (server RSS at rest after the soak
minus after the warm-up: must be <= 100), hostile_shapes (attacks made, by shape), and client_max_stall_s (the
longest the bench's own event loop was late: a reply that arrives while it stalls is timed that much longer).
To tell where a slow `/health` went, each call is timed in two parts on a thread of its own (the TCP connect: a SYN
the kernel dropped is sent again after 1 s, then 3 s; the request and its reply), with the attacks under way when
it was asked; the server runs its event-loop probe (`sqlenv.server.loop_probe`, on through `SQLENV_LOOP_PROBE_FILE`:
how late a 50 ms sleep wakes, the loop thread's time on a core and waiting for one, garbage collections, steps in
flight), and the kernel's listen-queue and SYN-retransmit counters are read before and after. Figures:
health_over_1s, max_health_connect_s, max_health_reply_s, loop_lag_max_s (the server's event loop at its latest),
loop_windows_over_0_5s, gc_max_s, honest_steps_over_1s, tcp_counters. `--shapes` makes only the hostile shapes named
(`SHAPES`; default all), `--python-slots` sets the server's Python slots (`SQLENV_PYTHON_SLOTS`; a large number is
no bound), `--server-args` adds `sqlenv serve` arguments.
Bounded: `--duration` (at most 3600 s) and `--max-requests`. The machine is shared: times are upper bounds.

Client and server share the machine, so the client is built not to stall: after the warm-up its objects are frozen
out of the garbage collector's full passes (as the server's are), which on a loaded machine took up to 0.95 s and
added that much to every reply timed across them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import http.client
import json
import os
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess  # noqa: E402
from sql_shapes import row_of  # noqa: E402

from frame_floods import flood_attack, forwarded_attack  # noqa: E402
from websocket_holds import few_addresses, mcp_silent, ping_flood_attack  # noqa: E402

from sqlenv.data.datasets import load_questions, resolve_dataset  # noqa: E402
from sqlenv.evaluation.policies import OraclePolicy  # noqa: E402
from sqlenv.server.client import SQLEnvClient  # noqa: E402
from sqlenv.server.app import DEFAULT_REQUEST_TIMEOUT_S as REQUEST_TIMEOUT_S, TRIM_INTERVAL_S  # noqa: E402
from sqlenv.server.app import DEFAULT_RESET_TIMEOUT_S as RESET_TIMEOUT_S  # noqa: E402
from sqlenv.server.environment import PYTHON_SLOTS_ENV  # noqa: E402
from sqlenv.server.loop_probe import PROBE_FILE_ENV  # noqa: E402
from sqlenv.server.models import SQLAction as WireAction  # noqa: E402

STEP_LIMIT_S = 5.0  # the server's default SQL time limit (SandboxSettings.timeout_s)
HOSTILE_ADDRESS = "127.0.0.2"
HEALTH_EVERY_S = 0.25  # where the hostile sessions connect from (any of 127/8 reaches a loopback server)

_A = "replace(hex(zeroblob({n})), '0', 'a')"


HOSTILE_SQL = [
    # Quadratic instr over the longest values allowed, many calls per row, row after row.
    "WITH s(a, b) AS (SELECT " + _A.format(n=3300) + ", " + _A.format(n=1600) + " || 'b'), "
    "r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT " + row_of("instr(a, b)", 300) + " FROM s, r",
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
    "SELECT " + row_of("trim(x, y)", 600) + " FROM s",
    "WITH s(x, p) AS (SELECT " + _A.format(n=4500) + ", '*[' || " + _A.format(n=240).replace("'a'", "'b'")
    + " || 'a]c') SELECT " + row_of("x GLOB p", 600) + " FROM s",
]
#: Issue 35: cheap as sent (DISTINCT keeps each side at 3 rows), a 3000^3-row cross join once DISTINCT is removed,
#: as the official EX does when it re-runs the last query after ANSWER.
_THREES = "(SELECT DISTINCT n % 3 AS j FROM r)"
DISTINCT_EX_SQL = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT 3000) "
                   f"SELECT count(DISTINCT a.j) FROM {_THREES} a, {_THREES} b, {_THREES} c")
#: Issue 35: a code fence and ~28 KB of newlines, which a backtracking answer pattern took 17 s over.
FENCE_ANSWER = "```" + "\n" * 28_000
#: Issue 43: a distinct select list of 120 long-named columns (~100 KB prepared, which Python's sqlite3 keeps per
#: connection: 64 of them); a session sends 64 after each of 6 resets (the built-in data's 6 databases, when drawn),
#: then sits idle holding them: up to ~38 MB a session.
FILL_DATABASES, FILL_STATEMENTS = 6, 64
WIDE_LIST_SQL = "SELECT {nonce}, " + ", ".join(f'{j} AS "{"c" * 140}{j}"' for j in range(120))
#: Issue 43: rows as wide and as long as the limits allow (128 values of ~10 KB), counted past the 32 MB cap until
#: the time limit; and the issue's own shape, 1,990 columns (refused: too many columns).
_LONGEST = "s(v) AS (SELECT " + _A.format(n=4990) + ")"
WIDE_ROWS_SQL = ["WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r), " + _LONGEST + " SELECT "
                 + ", ".join(["v"] * 128) + " FROM r, s",
                 "WITH " + _LONGEST + " SELECT " + ", ".join(["v"] * 1990) + " FROM s, (SELECT 1 UNION ALL SELECT 2)"]
#: Issue 43: SQLite checks no time while it prepares, and copies every level's expression into its three uses:
#: 3^14 copies, seconds until the heap is full (now priced from the text and refused unprepared). Then the EX
#: rerun left no time: a query cheap with DISTINCT, then the budget's last step runs to its time limit.
PREPARE_BOMB_SQL = "SELECT 1 AS c0"
for _level in range(1, 15):
    PREPARE_BOMB_SQL = f"SELECT {'+'.join([f'c{_level - 1}'] * 3)} AS c{_level} FROM ({PREPARE_BOMB_SQL})"
RUNAWAY_SQL = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
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
#: The hostile shapes, by name (`--shapes`), with the share of attack rounds each starts. A WebSocket round
#: ("session") resets, then sends 1-8 actions drawn from the enabled ones of costly-sql, trim-glob, garbage and idle,
#: and drops its TCP connection without a close frame 30% of the time when abort is enabled.
ROUND_SHAPES = {"http-create": 0.05, "half-sent": 0.02, "never-reset": 0.03, "huge-id": 0.02, "distinct-ex": 0.05,
                "fence-answer": 0.04, "no-read": 0.02, "web-routes": 0.02, "many-values": 0.03,
                "statement-fill": 0.03, "prepare-ex": 0.03, "mcp-silent": 0.02, "ping-flood": 0.01,
                "few-addresses": 0.01, "continuation-flood": 0.01, "fragments": 0.01, "forwarded-for": 0.01}
#: Where `forwarded-for` connects from: an address of its own, so its share is not the other attacks'.
FORWARDED_ADDRESS = "127.0.0.31"
SESSION_ACTIONS = {"costly-sql": 0.6 * 14 / 16, "trim-glob": 0.6 * 2 / 16, "garbage": 0.3, "idle": 0.1,
                   "wide-rows": 0.05}
SHAPES = [*ROUND_SHAPES, *SESSION_ACTIONS, "abort"]
#: Issue 43: a WebSocket handshake to OpenEnv's web interface's UI socket (answered 101 there, which then awaited it
#: inside every `/web/step`).
UI_HANDSHAKE = (b"GET /ws/ui HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
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
        self.honest_over_1s = 0  # honest steps that waited more than 1 s
        self.slowest_honest_at = 0.0  # when the slowest honest step was sent (time.monotonic())
        self.health_failures = 0
        self.max_health_s = 0.0
        self.client_max_stall_s = 0.0
        self.shapes: dict[str, int] = {}  # attacks made, by shape
        self.in_flight: dict[str, int] = {}  # attacks under way now, by shape
        # /health calls: (asked at, connect s, reply s, ok, attacks in flight, s the calling thread waited for a core)
        self.health: list[tuple[float, float, float, bool, dict, float]] = []

    def made(self, shape: str) -> None:
        self.shapes[shape] = self.shapes.get(shape, 0) + 1

    @contextlib.contextmanager
    def doing(self, shape: str):
        """Count `shape` made, and under way while the block runs."""
        self.made(shape)
        self.in_flight[shape] = self.in_flight.get(shape, 0) + 1
        try:
            yield
        finally:
            self.in_flight[shape] -= 1

    def step_time(self, who: str, seconds: float, what: str) -> None:
        if who == "honest":
            self.honest_over_1s += seconds > 1.0
            if seconds > self.max_step_s[who]:
                self.slowest_honest_at = time.monotonic() - seconds
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


def _http(url: str, body: bytes, timeout: float = 30.0, headers: dict | None = None) -> tuple[int, bytes]:
    """(status, the first 100 KB of the reply); status 0 when the connection failed."""
    request = urllib.request.Request(url, data=body, headers=headers or {"Content-Type": "application/json"})
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


@functools.cache
def many_values(size: int) -> str:
    """A JSON text of `size` bytes of `{}`s (a third as many objects)."""
    return "[" + ",".join(["{}"] * (size // 3)) + "]"


def upload_body(boundary: str) -> bytes:
    """A multipart upload of one 0.9 MB file."""
    return (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + b"x" * 900_000 \
        + f"\r\n--{boundary}--\r\n".encode()


async def no_read(port: int, hold_s: float, tally: Tally) -> None:
    """A WebSocket handshake to `/ws/ui` and a session on `/ws` that answers with 1,000,000 characters and asks
    for its state 30 times (~30 MB of replies), neither read, held `hold_s` seconds, then dropped. The UI socket
    accepted is a breach; whether the unread session delays anyone shows in the honest figures."""
    from websockets.asyncio.client import connect

    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(HOSTILE_ADDRESS, 0))
    try:
        writer.write(UI_HANDSHAKE)
        if (await asyncio.wait_for(reader.read(12), 30)).endswith(b"101"):
            tally.breaches.append("a UI socket (/ws/ui) was accepted")
        async with connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None, open_timeout=30,
                           max_queue=1, local_addr=(HOSTILE_ADDRESS, 0)) as ws:  # stops reading once one waits
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            await ws.send(_step("ANSWER", "7" * 1_000_000))
            for _ in range(30):
                await ws.send(json.dumps({"type": "state"}))
            await asyncio.sleep(hold_s)
            ws.transport.abort()
    finally:
        writer.transport.abort()


async def hostile(url: str, port: int, index: int, deadline: float, budget: "Budget", tally: Tally,
                  shapes: frozenset[str] = frozenset(SHAPES), per_client: int = 16) -> None:
    """Attack rounds until `deadline`, each of one of the enabled `shapes` (`ROUND_SHAPES`, `SESSION_ACTIONS`);
    `per_client` is the server's `--max-sessions-per-client`."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    rng = random.Random(10_000 + index)
    rounds = {name: weight for name, weight in ROUND_SHAPES.items() if name in shapes}
    actions = {name: weight for name, weight in SESSION_ACTIONS.items() if name in shapes}
    if actions or "abort" in shapes:
        rounds["session"] = 1.0 - sum(ROUND_SHAPES.values())
    if not rounds:
        return
    while time.monotonic() < deadline and budget.take():
        attack = rng.choices(list(rounds), weights=list(rounds.values()))[0]
        try:
            if attack == "http-create":  # sessions over HTTP, however spelled (refused), and an oversized body (413)
                with tally.doing(attack):
                    status, reply = await asyncio.to_thread(_http, url + "/mcp", rng.choice(SESSION_CREATE_BODIES))
                    if status == 200 and b'"result"' in reply:
                        tally.breaches.append(f"session opened over HTTP /mcp: {reply[:120]!r}")
                    await asyncio.to_thread(_http, url + "/step", b" " * (2 * 1024 * 1024))
                tally.requests += 2
                tally.hostile_refused += 2
                continue
            if attack == "half-sent":  # requests that stop half-way, a few at once
                with tally.doing(attack):
                    await half_sent(port, [rng.choice(HALF_SENT) for _ in range(rng.randint(1, 5))], tally)
                tally.requests += 1
                continue
            if attack == "never-reset":  # WebSockets that never send anything: closed at the reset timeout
                with tally.doing(attack):
                    await never_reset(port, rng.randint(1, 4), tally)
                continue
            if attack == "no-read":  # a UI socket and a session that never read (issue 43)
                with tally.doing(attack):
                    await no_read(port, rng.uniform(1.0, 3.0), tally)
                tally.requests += 2
                tally.hostile_refused += 1
                continue
            if attack == "mcp-silent":  # silent /mcp sockets, and values on /mcp (issue 49)
                with tally.doing(attack):
                    await mcp_silent(port, HOSTILE_ADDRESS, rng.randint(1, 4), RESET_TIMEOUT_S, tally)
                continue
            if attack == "ping-flood":  # pings from a client that reads nothing, held to the reset deadline or not
                with tally.doing(attack):
                    await ping_flood_attack(port, HOSTILE_ADDRESS, rng.choice([rng.uniform(1.0, 5.0),
                                                                              RESET_TIMEOUT_S + 5.0]), tally)
                tally.requests += 1
                continue
            if attack == "few-addresses":  # four addresses at their share, and a newcomer
                with tally.doing(attack):
                    await few_addresses(port, f"127.0.1.{index % 250 + 1}", rng.uniform(1.0, 5.0), tally)
                continue
            if attack in ("continuation-flood", "fragments"):  # frames that complete no message (issue 59)
                with tally.doing(attack):
                    await flood_attack(port, HOSTILE_ADDRESS, "continuation" if attack == "continuation-flood"
                                       else "fragments", rng.uniform(1.0, 5.0), tally)
                continue
            if attack == "forwarded-for":  # 64 sessions from one address naming 64 others (issue 59)
                with tally.doing(attack):
                    await forwarded_attack(port, FORWARDED_ADDRESS, rng.uniform(1.0, 5.0), tally, per_client)
                continue
            if attack == "web-routes":  # an upload and a 1 MB step to OpenEnv's web routes: not served
                boundary = f"soak{rng.getrandbits(64):x}"
                with tally.doing(attack):
                    upload, _ = await asyncio.to_thread(
                        _http, url + "/web/gradio_api/upload", upload_body(boundary),
                        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
                    step, _ = await asyncio.to_thread(_http, url + "/web/step", json.dumps(
                        {"action": {"action_type": "QUERY", "argument": "x" * 1_000_000}}).encode())
                for route, status in (("upload", upload), ("step", step)):
                    if status == 200:
                        tally.breaches.append(f"OpenEnv's web {route} was served under /web")
                tally.requests += 2
                tally.hostile_refused += 2
                continue
            async with connect(f"ws://127.0.0.1:{port}/ws", proxy=None, compression=None, open_timeout=30,
                               max_size=None, local_addr=(HOSTILE_ADDRESS, 0)) as ws:

                async def timed(frame: str, what: str, shape: str) -> str:
                    started = time.monotonic()
                    with tally.doing(shape) if shape else contextlib.nullcontext():
                        await ws.send(frame)
                        reply = await asyncio.wait_for(ws.recv(), 60)
                    tally.step_time("hostile", time.monotonic() - started, what)
                    tally.requests += 1
                    return reply

                if attack == "huge-id":  # a 1 MB question_id: refused, and not sent back
                    with tally.doing(attack):
                        await ws.send(json.dumps({"type": "reset", "data": {"question_id": "q" * 1_000_000}}))
                        reply = await asyncio.wait_for(ws.recv(), 60)
                    tally.requests += 1
                    tally.hostile_refused += 1
                    if len(reply) > 10_000:
                        tally.breaches.append(f"a 1 MB question_id sent back ({len(reply):,} characters)")
                    continue
                await ws.send(json.dumps({"type": "reset", "data": {}}))
                await asyncio.wait_for(ws.recv(), 60)
                tally.requests += 1
                if attack == "many-values":  # 1 MiB of `{}`s (under the size limit) or 16 MiB: closed unparsed
                    with tally.doing(attack):
                        await ws.send(many_values(rng.choice([1, 16]) * 1024 * 1024))
                        await asyncio.wait_for(ws.recv(), 60)
                    tally.breaches.append("a message of {}s was parsed and answered")
                    continue
                if attack == "distinct-ex":  # cheap with DISTINCT, then ANSWER (EX re-runs it without), then `state`
                    with tally.doing(attack):  # made once, in flight for the three replies
                        await timed(_step("QUERY", DISTINCT_EX_SQL), "QUERY " + DISTINCT_EX_SQL, "")
                        await timed(_step("ANSWER", "3"), "ANSWER after the DISTINCT query", "")
                        await timed(json.dumps({"type": "state"}), "state after the DISTINCT query's ANSWER", "")
                elif attack == "fence-answer":  # a code fence and ~28 KB of newlines
                    await timed(_step("ANSWER", FENCE_ANSWER), "ANSWER ``` + 28,000 newlines", attack)
                elif attack == "prepare-ex":  # a costly prepare; then a last step that leaves EX's rerun no time
                    with tally.doing(attack):
                        await ws.send(json.dumps({"type": "reset", "data": {"step_budget": 3}}))
                        await asyncio.wait_for(ws.recv(), 60)
                        tally.requests += 1
                        await timed(_step("QUERY", PREPARE_BOMB_SQL), "QUERY of 3^14 copies to prepare", "")
                        await timed(_step("QUERY", DISTINCT_EX_SQL), "QUERY cheap with DISTINCT", "")
                        await timed(_step("QUERY", RUNAWAY_SQL), "the budget's last QUERY, to its time limit", "")
                elif attack == "statement-fill":  # distinct wide statements on several databases, then idle
                    with tally.doing(attack):
                        for database in range(FILL_DATABASES):
                            if database:
                                await ws.send(json.dumps({"type": "reset", "data": {"seed": rng.randrange(2**31)}}))
                                await asyncio.wait_for(ws.recv(), 60)
                                tally.requests += 1
                            for _ in range(FILL_STATEMENTS):
                                sql = WIDE_LIST_SQL.format(nonce=rng.randrange(2**62))
                                await timed(_step("QUERY", sql), "QUERY of a distinct wide select list", "")
                        await asyncio.sleep(rng.uniform(3.0, 8.0))  # idle, holding what they prepared
                for _ in range(rng.randint(1, 8) if attack == "session" and actions else 0):
                    if time.monotonic() > deadline:
                        break
                    kind = rng.choices(list(actions), weights=list(actions.values()))[0]
                    if kind == "costly-sql":
                        sql = rng.choice(HOSTILE_SQL[:-2])
                    elif kind == "trim-glob":
                        sql = rng.choice(HOSTILE_SQL[-2:])
                    elif kind == "wide-rows":
                        sql = rng.choice(WIDE_ROWS_SQL)
                    elif kind == "garbage":
                        sql = rng.choice(GARBAGE_FRAMES)
                    else:
                        with tally.doing(kind):
                            await asyncio.sleep(rng.uniform(0.5, 3.0))  # idle
                        continue
                    await timed(sql if kind == "garbage" else _step("QUERY", sql), sql, kind)
                if attack == "session" and "abort" in shapes and rng.random() < 0.3:
                    tally.made("abort")
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


def _run_queue_s() -> float:
    """Seconds this thread has waited for a core so far (schedstat), or 0.0 where the kernel does not say."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _timed_health(port: int) -> tuple[bool, float, float, float]:
    """(healthy, connect seconds, reply seconds, seconds this thread waited for a core) of one `/health` call on a
    new connection, timed in the calling thread (not across the client's loop): the TCP connect (a dropped SYN is
    retried after 1 s, then 3 s) apart from the request and its reply (the server's event loop). A connection that
    fails counts as connect time."""
    queued = _run_queue_s()
    started = time.monotonic()
    connected = started
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
    try:
        conn.connect()
        connected = time.monotonic()
        conn.request("GET", "/health")
        response = conn.getresponse()
        healthy = response.status == 200 and json.loads(response.read()).get("status") == "healthy"
    except Exception:  # noqa: BLE001 - a failure is a figure
        healthy = False
    finally:
        conn.close()
    return healthy, connected - started, time.monotonic() - connected, _run_queue_s() - queued


async def watch(port: int, pid: int, deadline: float, tally: Tally, rss: list) -> None:
    """`/health` every `HEALTH_EVERY_S` on a thread of its own (its longest wait is `max_health_s`; each call's
    connect and reply times and the attacks under way when it was asked are kept), the server's RSS every 2 s."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    next_rss = 0.0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="health") as own:
        while time.monotonic() < deadline:
            asked, in_flight = time.monotonic(), {k: v for k, v in tally.in_flight.items() if v}
            healthy, connect_s, reply_s, queued_s = await loop.run_in_executor(own, _timed_health, port)
            tally.health_failures += not healthy
            tally.max_health_s = max(tally.max_health_s, connect_s + reply_s)
            tally.health.append((asked, connect_s, reply_s, healthy, in_flight, queued_s))
            if time.monotonic() >= next_rss:
                rss.append(_rss_mb(pid))
                next_rss = time.monotonic() + 2.0
            await asyncio.sleep(HEALTH_EVERY_S)


def _tcp_counters() -> dict[str, int]:
    """The kernel's TCP counters that a lost connection attempt shows in (this network namespace: the soak's
    client and server, and whatever else runs here): listen-queue overflows and drops, SYN retransmits,
    retransmission timeouts (after a retransmitted SYN the first one waits 3 s: RFC 6298 5.7), TIME_WAIT
    entries reused, segments refused by their timestamps (PAWS), challenge ACKs."""
    wanted = {"ListenOverflows", "ListenDrops", "TCPSynRetrans", "TCPTimeouts", "TWRecycled", "PAWSEstab", "PAWSOldAck",
              "TCPChallengeACK"}
    found: dict[str, int] = {}
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return found
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            for name, value in zip(names.split()[1:], values.split()[1:]):
                if name in wanted:
                    found[name] = int(value)
    return found


def _read_probe(path: Path) -> list[dict]:
    """The server's loop-probe windows (`sqlenv.server.loop_probe`), oldest first."""
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def per_client(args: argparse.Namespace) -> int:
    """The server's `--max-sessions-per-client`: the honest sessions (127.0.0.1) fit their address's limit; the
    hostile ones (127.0.0.2) share theirs with their never-reset sockets, and together can never fill the server."""
    return max(args.honest, 16)


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
                             *(hostile(server.url, server.port, i, time.monotonic() + 60.0, Budget(2), warm,
                                       args.shapes, per_client(args)) for i in range(args.hostile)))
        await asyncio.to_thread(server.wait_sessions, args.honest, 30.0)
        rss_after_warmup = _rss_mb(server.proc.pid)
        gc.collect()
        gc.freeze()  # the clients, questions and libraries live to the end: keep them out of full collections
        tcp_before = _tcp_counters()
        started = time.monotonic()
        deadline = started + args.duration
        budget = Budget(args.max_requests)
        await asyncio.gather(watch(server.port, server.proc.pid, deadline, tally, rss), loop_stalls(deadline, tally),
                             *(honest(c, (questions,), i, deadline, budget, tally) for i, c in enumerate(clients)),
                             *(hostile(server.url, server.port, i, deadline, budget, tally, args.shapes,
                                       per_client(args)) for i in range(args.hostile)))
    tcp_after = _tcp_counters()
    return {"rss_after_warmup": rss_after_warmup, "rss_samples": rss, "warmup_errors": warm.honest_errors,
            "warmup_breaches": warm.breaches, "soak_window": (started, time.monotonic()),
            "tcp": {name: tcp_after[name] - tcp_before.get(name, 0) for name in tcp_after}}


def _overlapping(probe: list[dict], start: float, end: float) -> list[dict]:
    return [w for w in probe if w["t1"] >= start and w["t0"] <= end]


def _health_figures(calls: list, probe: list[dict]) -> dict:
    """The `/health` calls and the server's loop probe taken together: how many calls were slow and why (a long
    connect is a SYN the kernel dropped and retried; a long reply is the server's event loop, or this client),
    and the probe's windows around the slowest call and the loop's latest wake-ups."""
    worst = max(calls, key=lambda c: c[1] + c[2], default=None)
    out: dict = {
        "calls": len(calls), "over_1s": sum(c[1] + c[2] > 1.0 for c in calls),
        "connect_over_0_9s": sum(c[1] + c[2] > 1.0 and c[1] >= 0.9 for c in calls),
        "max_connect_s": max((c[1] for c in calls), default=0.0),
        "max_reply_s": max((c[2] for c in calls), default=0.0),
        "loop_lag_max_s": max((w["lag_max_s"] for w in probe), default=float("nan")),
        "loop_windows_over_0_5s": sum(w["lag_max_s"] > 0.5 for w in probe),
        "gc_max_s": max((w["gc_max_s"] for w in probe), default=float("nan")),
        "health_in_app_max_s": max((w.get("health_max_s", 0.0) for w in probe), default=float("nan")),
        "steps_max": max((w["steps_max"] for w in probe), default=0),
        "threads_max": max((w["threads"] for w in probe), default=0),
        "laggiest": sorted(probe, key=lambda w: -w["lag_max_s"])[:3], "worst": None}
    if worst is not None:
        asked, connect_s, reply_s, _, in_flight, queued_s = worst
        loop = _overlapping(probe, asked, asked + connect_s + reply_s)
        out["worst"] = {"at": asked, "connect_s": connect_s, "reply_s": reply_s, "in_flight": in_flight,
                        "client_thread_run_queue_s": round(queued_s, 3),
                        "loop": {"lag_max_s": max((w["lag_max_s"] for w in loop), default=None),
                                 "loop_cpu_s": round(sum(w["loop_cpu_s"] for w in loop), 3),
                                 "loop_runq_s": round(sum(w["loop_runq_s"] for w in loop), 3),
                                 "proc_cpu_s": round(sum(w["proc_cpu_s"] for w in loop), 3),
                                 "gc_max_s": max((w["gc_max_s"] for w in loop), default=None),
                                 "health_in_app_s": max((w.get("health_max_s", 0.0) for w in loop), default=None),
                                 "steps_max": max((w["steps_max"] for w in loop), default=None),
                                 "windows": len(loop)}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of soak (default 600, at most 3600)")
    parser.add_argument("--honest", type=int, default=64, help="honest sessions (default 64)")
    parser.add_argument("--hostile", type=int, default=64, help="hostile sessions (default 64)")
    parser.add_argument("--dataset", default="builtin", help="dataset served (default builtin)")
    parser.add_argument("--max-requests", type=int, default=1_000_000,
                        help="most episodes and attack rounds in all (default 1,000,000)")
    parser.add_argument("--shapes", default="all",
                        help="the hostile shapes to make, comma-separated (default all): " + ", ".join(SHAPES))
    parser.add_argument("--python-slots", type=int, default=None,
                        help="the server's Python slots (SQLENV_PYTHON_SLOTS; default the server's: one per core; "
                             "a large number is no bound)")
    parser.add_argument("--web", action="store_true", help="start the server with --web, as the Dockerfile does")
    parser.add_argument("--server-args", default="",
                        help="more `sqlenv serve` arguments, space-separated (e.g. a limit to compare)")
    args = parser.parse_args()
    wanted = SHAPES if args.shapes == "all" else [name.strip() for name in args.shapes.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(SHAPES))
    if unknown or not wanted:
        parser.error(f"--shapes: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(SHAPES)}")
    args.shapes = frozenset(wanted)
    if not 0 < args.duration <= 3600 or not 0 <= args.honest <= 128 or not 0 <= args.hostile <= 128:
        parser.error("--duration must be in (0, 3600], --honest and --hostile in 0..128")

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; soak {args.duration:g} s, "
          f"{args.honest} honest + {args.hostile} hostile sessions; shapes "
          f"{'all' if args.shapes == frozenset(SHAPES) else ', '.join(sorted(args.shapes))}"
          f"{'; server ' + args.server_args if args.server_args else ''}{'; --web' if args.web else ''}"
          f"{f'; Python slots {args.python_slots}' if args.python_slots is not None else ''}")
    info = resolve_dataset(args.dataset)
    questions = load_questions(info.questions_path("train"))
    probe_dir = tempfile.TemporaryDirectory(prefix="soak-probe-")
    probe_file = Path(probe_dir.name) / "loop.jsonl"
    os.environ[PROBE_FILE_ENV] = str(probe_file)  # the server's event-loop probe (sqlenv.server.loop_probe)
    if args.python_slots is not None:
        os.environ[PYTHON_SLOTS_ENV] = str(args.python_slots)
    try:
        server = ServerProcess(["--dataset", str(info.root), "--split", "train", "--max-sessions-per-client",
                                str(per_client(args)), "--max-sessions", str(args.honest + per_client(args) + 8),
                                *(["--web"] if args.web else []), *args.server_args.split()]).start()
    finally:
        os.environ.pop(PROBE_FILE_ENV, None)
        os.environ.pop(PYTHON_SLOTS_ENV, None)
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
    soak_from, soak_to = extra["soak_window"]
    probe = [w for w in _read_probe(probe_file) if soak_from <= w["t1"] and w["t0"] <= soak_to]
    probe_dir.cleanup()
    health = _health_figures(tally.health, probe)
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
    print(f"/health: {health['calls']} calls, {health['over_1s']} over 1 s ({health['connect_over_0_9s']} of them "
          f"with a connect >= 0.9 s: a SYN retried); longest connect {health['max_connect_s']:.2f} s, longest reply "
          f"{health['max_reply_s']:.2f} s; TCP counters over the soak: "
          + ", ".join(f"{k} {v}" for k, v in sorted(extra["tcp"].items())))
    print(f"honest steps over 1 s: {tally.honest_over_1s}; the slowest sent at soak "
          f"+{tally.slowest_honest_at - soak_from:.0f} s")
    worst = health["worst"]
    if worst:
        print(f"slowest /health: {worst['connect_s']:.2f} s connect + {worst['reply_s']:.2f} s reply, at soak "
              f"+{worst['at'] - soak_from:.0f} s (the calling thread waited {worst['client_thread_run_queue_s']:.2f} "
              f"s for a core), attacks under way {worst['in_flight']}; the server's loop then: "
              f"{worst['loop']}")
    print(f"server event loop (probe, 50 ms ticks): longest lateness {health['loop_lag_max_s']:.2f} s, windows "
          f"over 0.5 s {health['loop_windows_over_0_5s']}; longest GC pause {health['gc_max_s']:.3f} s; most "
          f"steps in flight {health['steps_max']}, threads {health['threads_max']}; longest /health inside the app "
          f"{health['health_in_app_max_s']:.3f} s")
    for window in health["laggiest"]:
        print("  late loop window:", json.dumps(window))
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
        "shapes": "all" if args.shapes == frozenset(SHAPES) else sorted(args.shapes), "server_args": args.server_args,
        "web": args.web,
        "python_slots": args.python_slots,
        "honest_steps_over_1s": tally.honest_over_1s, "health_over_1s": health["over_1s"],
        "max_health_connect_s": round(health["max_connect_s"], 3),
        "max_health_reply_s": round(health["max_reply_s"], 3), "loop_lag_max_s": round(health["loop_lag_max_s"], 3),
        "loop_windows_over_0_5s": health["loop_windows_over_0_5s"], "gc_max_s": round(health["gc_max_s"], 3),
        "health_in_app_max_s": round(health["health_in_app_max_s"], 3),
        "tcp_counters": extra["tcp"],
    }))


if __name__ == "__main__":
    main()
