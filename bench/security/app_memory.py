"""What anonymous visitors' inputs leave in the dashboard's memory (issue 35, finding 4).

    python bench/security/app_memory.py [--sessions 50] [--input-mb 30] [--allowed-sessions 256] [--settle 5]
    python bench/security/app_memory.py --sessions 1 --input-mb 1 --allowed-sessions 1 --expire-sessions 1 \\
        --settle 0                                                              # CI's smallest form

Serves the app (`python app.py`, open mode, its own empty runs/ and data/) on 127.0.0.1 and measures its RSS:

1. idle: after one call of each event used below;
2. hostile: `--sessions` anonymous sessions, each with a new session hash, each sending `--input-mb` MB inputs
   to three public events: the Runs table's `select_row` (a table), Play's step (its argument) and Play's new
   episode (its dataset name). Gradio once stored every one of them in the session before any handler ran, and
   kept 10,000 sessions: +38 MB a call, still there minutes later;
3. allowed: `--allowed-sessions` sessions (default twice the app's default of 128 kept), each sending the largest
   values the app takes for the same events;
4. expired: as many new sessions as the app keeps (`SQLENV_APP_SESSIONS`, default 128) each make one small call,
   as new visitors would, which pushes every earlier session out; then the RSS at rest.

Prints, last line one JSON object: the RSS after each phase and its growth over idle (target: expired <= idle +
300 MB), the HTTP statuses each phase got, how long the hostile phase took, and the app's CPU seconds. Every
loop is bounded by its session count; only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402
from app_server import app_config, serve  # noqa: E402

from dashboard.access.inputs import MAX_SMALL_INPUT_BYTES, MAX_TABLE_BYTES, python_size  # noqa: E402

TABLE_HEADERS = ["run", "status", "model", "dataset", "steps", "success", "EX", "measured on", "started"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def table(rows: int, cell_chars: int = 20) -> dict:
    """A Runs table as the page sends it with a row selection."""
    row = ["r" * cell_chars] * len(TABLE_HEADERS)
    return {"headers": TABLE_HEADERS, "data": [list(row) for _ in range(rows)], "metadata": None}


def table_within(limit: int) -> dict:
    """The largest table (rows of short cells) whose Python size, as the server parses it, is within `limit`."""
    def fits(rows: int) -> bool:
        return python_size(json.loads(json.dumps(table(rows))), limit) <= limit

    high = 1
    while fits(high * 2):
        high *= 2
    low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return table(low)


class App:
    """Calls events the way the page does (queue join, then the session's event stream) with a prepared body."""

    def __init__(self, url: str, config: dict):
        self.base = url.rstrip("/") + "/gradio_api"
        self.ids = {d["api_name"]: d["id"] for d in config["dependencies"] if d.get("backend_fn")}
        self.http = httpx.Client(timeout=300)

    def call(self, api: str, data_json: bytes, session: str, event_data: str = "null") -> int:
        """HTTP status of the join (0: the connection was cut while the body was sent, as a refusal does)."""
        body = (b'{"data": ' + data_json + b', "fn_index": ' + str(self.ids[api]).encode() + b', "session_hash": "'
                + session.encode() + b'", "trigger_id": null, "event_data": ' + event_data.encode() + b"}")
        try:
            joined = self.http.post(self.base + "/queue/join", content=body,
                                    headers={"content-type": "application/json"})
        except httpx.TransportError:
            return 0
        if joined.status_code == 200:
            with self.http.stream("GET", self.base + "/queue/data", params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                        break
        return joined.status_code


def visit(app: App, inputs: dict[str, bytes], sessions: int, statuses: Counter, prefix: str) -> None:
    select_data = json.dumps({"index": [0, 0], "value": "r", "row_value": ["r"] * len(TABLE_HEADERS),
                              "selected": True})
    for i in range(sessions):
        session = f"{prefix}-{i}-{secrets.token_hex(4)}"
        statuses["select_row " + str(app.call("select_row", inputs["table"], session, select_data))] += 1
        statuses["do_step " + str(app.call("do_step", inputs["step"], session))] += 1
        statuses["new_episode " + str(app.call("new_episode", inputs["episode"], session))] += 1


def settle(pid: int, seconds: float = 5.0) -> float:
    time.sleep(seconds)
    return rss_mb(pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50, help="hostile sessions (default 50)")
    parser.add_argument("--input-mb", type=float, default=30.0, help="size of each hostile input in MB (default 30)")
    parser.add_argument("--allowed-sessions", type=int, default=256,
                        help="sessions sending the largest allowed inputs (default 256)")
    parser.add_argument("--expire-sessions", type=int, default=128,
                        help="small new sessions that push the earlier ones out (default 128, the app's capacity)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds the app rests before each RSS reading (default 5; twice that after expiry)")
    args = parser.parse_args()
    if not (0 <= args.sessions <= 500 and 0 < args.input_mb <= 100 and 0 <= args.allowed_sessions <= 2000
            and 0 <= args.expire_sessions <= 2000 and 0 <= args.settle <= 120):
        parser.error("--sessions 0..500, --input-mb (0, 100], --allowed-sessions and --expire-sessions 0..2000, "
                     "--settle 0..120")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    n = int(args.input_mb * 1_000_000)
    big = json.dumps("x" * n).encode()
    hostile = {"table": json.dumps([table(max(1, n // (len(TABLE_HEADERS) * 23)))]).encode(),
               "step": b'["QUERY", ' + big + b", null]", "episode": b"[" + big + b', "eval", "random", 15, null]'}
    allowed = {"table": json.dumps([table_within(MAX_TABLE_BYTES)]).encode(),
               "step": json.dumps(["QUERY", "\U0001F600" * 20_000, None]).encode(),
               "episode": json.dumps(["d" * (MAX_SMALL_INPUT_BYTES - 100), "eval", "random", 15, None]).encode()}
    small = {"table": json.dumps([table(3)]).encode(), "step": b'["QUERY", "SELECT 1", null]',
             "episode": b'["no-such-dataset", "eval", "random", 15, null]'}  # refused by Play: no episode
    with serve(log_name="app-memory") as served:
        pid = served["proc"].pid
        app = App(served["url"], app_config(served["url"]))
        visit(app, small, 3, Counter(), "warm")
        idle = settle(pid, args.settle)
        cpu_start, started = cpu_s(pid), time.monotonic()
        hostile_statuses: Counter = Counter()
        visit(app, hostile, args.sessions, hostile_statuses, "hostile")
        hostile_s, hostile_cpu = time.monotonic() - started, cpu_s(pid) - cpu_start
        after_hostile = settle(pid, args.settle)
        print(f"hostile: {args.sessions} sessions x 3 inputs of {args.input_mb:g} MB in {hostile_s:.1f} s "
              f"({hostile_cpu:.1f} s of app CPU): {dict(hostile_statuses)}; RSS {idle:.0f} -> {after_hostile:.0f} MB")
        allowed_statuses: Counter = Counter()
        peak = after_hostile
        for start in range(0, args.allowed_sessions, 32):
            visit(app, allowed, min(32, args.allowed_sessions - start), allowed_statuses, f"allowed{start}")
            peak = max(peak, rss_mb(pid))
        after_allowed = settle(pid, args.settle)
        print(f"allowed: {args.allowed_sessions} sessions x the largest inputs taken: {dict(allowed_statuses)}; "
              f"RSS {after_allowed:.0f} MB (peak {peak:.0f})")
        visit(app, small, args.expire_sessions, Counter(), "new")
        expired = settle(pid, 2 * args.settle)
        print(f"after {args.expire_sessions} new sessions pushed the earlier ones out: RSS {expired:.0f} MB, "
              f"{expired - idle:+.0f} MB over idle (target <= +300)")
        cpu_total = cpu_s(pid) - cpu_start
    print(json.dumps({
        "sessions": args.sessions, "input_mb": args.input_mb, "allowed_sessions": args.allowed_sessions,
        "expire_sessions": args.expire_sessions, "rss_idle_mb": round(idle, 1),
        "rss_after_hostile_mb": round(after_hostile, 1), "rss_after_allowed_mb": round(after_allowed, 1),
        "rss_peak_mb": round(peak, 1), "rss_after_expiry_mb": round(expired, 1),
        "growth_after_expiry_mb": round(expired - idle, 1), "target_growth_mb": 300,
        "hostile_statuses": dict(hostile_statuses), "allowed_statuses": dict(allowed_statuses),
        "hostile_s": round(hostile_s, 1), "hostile_app_cpu_s": round(hostile_cpu, 1),
        "app_cpu_s": round(cpu_total, 1), "load_average_1m_end": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
