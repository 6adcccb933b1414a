"""What one statement, as wide or as long as the sandbox allows, makes a real server hold (issue 43, finding 2).

    python bench/security/result_memory.py [--dataset builtin] [--settle 12] [--shapes 1,2,3,4,5,6] [--rows 20000]
    python bench/security/result_memory.py --settle 0 --shapes 5,6 --rows 2000   # CI's smallest form (nothing runs 5 s)

Starts `python -m sqlenv serve` on 127.0.0.1 (a free port; stopped at the end). For each shape, one WebSocket
session resets and sends it as a QUERY; the server's peak resident memory during the step is read from the kernel
(`VmHWM` in /proc/PID/status, reset through /proc/PID/clear_refs before the step), against its resident memory just
before. Between shapes the server settles (`--settle` seconds: its periodic memory trim runs every 10 s).

The shapes: 128 columns (`max_columns`) of ~10 KB values (`max_value_bytes`), row after row until the time limit
(ASCII text; text with one 4-byte character, which Python stores at 4 bytes a character; blobs); one column of
~10 KB values; 20,000 rows (`--rows`) of 128 integers (the progress score's sets); and the issue's own shape, 1,990
columns of 10 KB (refused now: SQLite's default column limit was 2,000, and `fetchmany(256)` built a whole batch before a
byte of it was counted: RSS 209 -> 2,686 MB).

Prints one line per shape and, last, one JSON object: per shape its growth in MB (peak during the step minus
before), the bound (`max_result_bytes` + 64 MB) and whether it held, and the step's reply (rows or error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from serverproc import ServerProcess  # noqa: E402

from sqlenv.sandbox.limits import SandboxSettings  # noqa: E402

MB = 2**20
SLACK_MB = 64
_TEXT = "replace(hex(zeroblob(4990)), '0', 'a')"  # 9,980 characters: the longest a row of the queue allows
# One row at a time from a recursive CTE read once (its queue holds a row or two: SQLite's heap stays small), its
# value repeated across the select list: Python builds every column's object anew.
_ROWS = "WITH RECURSIVE r(n, v) AS (SELECT 1, {value} UNION ALL SELECT n + 1, v FROM r{limit}) "
ROWS = 20_000  # the progress score's sets: 128 integers a row, as many rows as the sandbox's time allows at rest


def shapes(rows: int = ROWS) -> dict[str, str]:
    """The statements measured, by name, in their numbered order (`rows`: the fifth shape's row count)."""
    return {
        "128 columns of 10 KB text": _ROWS.format(value=_TEXT, limit="") + "SELECT " + ", ".join(["v"] * 128)
        + " FROM r",
        "128 columns of 10 KB text with a 4-byte character": _ROWS.format(
            value="char(128512) || substr(" + _TEXT + ", 4)", limit="") + "SELECT " + ", ".join(["v"] * 128)
        + " FROM r",
        "128 columns of 10 KB blobs": _ROWS.format(value="zeroblob(9980)", limit="") + "SELECT "
        + ", ".join(["v"] * 128) + " FROM r",
        "1 column of 10 KB text": _ROWS.format(value=_TEXT, limit="") + "SELECT v || n FROM r",
        f"{rows:,} rows of 128 integers": _ROWS.format(value="1", limit=f" LIMIT {rows}") + "SELECT "
        + ", ".join(f"n * {j}" for j in range(128)) + " FROM r",
        "the issue's 1,990 columns of 10 KB": "WITH s(v) AS (SELECT " + _TEXT + ") SELECT " + ", ".join(["v"] * 1990)
        + " FROM s, (SELECT 1 UNION ALL SELECT 2)",
    }


def _status(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak(pid: int) -> bool:
    """Reset the process's peak resident memory (VmHWM) to its current one; False where the kernel refuses."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(url: str, pid: int, sql: str) -> dict:
    """One session: reset, then the QUERY, with the server's resident memory before and at its peak during it."""
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws") + "/ws", max_size=None, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        ws.recv(timeout=60)
        before = _status(pid, "VmRSS")
        exact = _reset_peak(pid)
        started = time.monotonic()
        ws.send(json.dumps({"type": "step", "data": {"action_type": "QUERY", "argument": sql}}))
        reply = json.loads(ws.recv(timeout=120))
        elapsed = time.monotonic() - started
        peak = _status(pid, "VmHWM") if exact else float("nan")
    observation = reply.get("data", {}).get("observation", {})
    error = observation.get("last_action_error") or observation.get("error") or ""
    history = observation.get("action_history") or [""]
    outcome = error[:80] if error else str(history[-1])[-40:]
    return {"before_mb": round(before, 1), "peak_mb": round(peak, 1), "growth_mb": round(peak - before, 1),
            "step_s": round(elapsed, 2), "reply": outcome}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="builtin", help="dataset served (default builtin)")
    parser.add_argument("--settle", type=float, default=12.0,
                        help="seconds between shapes, for the server's memory trim (default 12)")
    parser.add_argument("--shapes", default=None,
                        help=f"the shapes measured, by number in the order above, comma-separated (default: all "
                        f"{len(shapes())})")
    parser.add_argument("--rows", type=int, default=ROWS,
                        help="rows of the fifth shape (default %(default)s: 1.1 s at rest on 2 cores; CI's smallest "
                        "form takes fewer, which a loaded machine also runs within the 5 s limit)")
    args = parser.parse_args()
    if not 0 <= args.settle <= 120:
        parser.error("--settle must be in [0, 120]")
    if not 1 <= args.rows <= 1_000_000:
        parser.error("--rows must be in [1, 1000000]")
    measured = shapes(args.rows)
    numbers = args.shapes.split(",") if args.shapes else [str(i) for i in range(1, len(measured) + 1)]
    if not all(n.strip().isdigit() and 1 <= int(n) <= len(measured) for n in numbers):
        parser.error(f"--shapes: numbers from 1 to {len(measured)}, comma-separated")
    chosen = [list(measured)[int(n) - 1] for n in numbers]
    cap_mb = SandboxSettings().max_result_bytes / MB
    bound_mb = cap_mb + SLACK_MB
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; bound: the result cap {cap_mb:.1f} MB "
          f"+ {SLACK_MB} MB = {bound_mb:.1f} MB of resident memory a statement may add")
    results = {}
    with ServerProcess(["--dataset", args.dataset, "--split", "train"]) as server:
        pid = server.proc.pid
        print(f"server RSS at start {_status(pid, 'VmRSS'):.0f} MB")
        for name in chosen:
            sql = measured[name]
            time.sleep(args.settle)
            result = measure(server.url, pid, sql)
            result["held"] = bool(result["growth_mb"] <= bound_mb)
            results[name] = result
            print(f"  {name} ({len(sql):,} characters): RSS {result['before_mb']:.0f} -> peak {result['peak_mb']:.0f} "
                  f"MB (+{result['growth_mb']:.0f}; bound {bound_mb:.0f}: {'held' if result['held'] else 'EXCEEDED'}) "
                  f"in {result['step_s']:.1f} s; {result['reply']}")
        time.sleep(args.settle)
        rss_end = _status(pid, "VmRSS")
    worst = max(results.values(), key=lambda r: r["growth_mb"])
    print(json.dumps({"bound_mb": round(bound_mb, 1), "max_growth_mb": worst["growth_mb"],
                      "all_held": all(r["held"] for r in results.values()), "rss_end_mb": round(rss_end, 1),
                      "shapes": results, "load_average_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
