"""The worst time of one call of every function the SQL sandbox allows, against its price (issue 35).

    python bench/security/sql_function_costs.py [--calls 8] [--reps 3] [--before]

SQLite checks the time limit only at the jumps that close a loop, so the calls between two checks run unchecked;
`sqlenv.sandbox.sql_costs` prices every allowed function at its worst time per call and refuses a statement whose calls
could add up past `max_uninterruptible_s`. This measures those worst times: for every entry of
`sqlenv.sandbox.sql_costs.FUNCTION_PRICES`, one result row of `--calls` calls with arguments at the sandbox's limits
(values of `max_value_bytes`, patterns of `max_like_pattern_chars`, `max_function_args` arguments), built so each
call does its most work (a `trim` set whose matching character comes last, a `GLOB` class read at every position,
an `instr` needle that fails at its last byte, a JSON path at the end of the longest array...). The arguments come
from one-row tables, so every call runs (no constant is computed once). Times are the thread's CPU time
(`time.thread_time`, the best of `--reps`): on a shared machine wall time counts the waits for a core too.

Then the issue's shapes through a real `Sandbox` (default settings, 5 s): one row of 300 and 800 `trim(x, y)` calls
(x 9,000 characters, y 820), of 300 `x GLOB '*[bbb...a]c'` calls, and the most calls of each costly function the
price admits (the longest stretch a statement can run without a check). `--before` also runs the issue's shapes on
a plain connection with the limits as they were (LIKE patterns of 500 bytes, no pricing): their time then, for
comparison (up to ~30 s of CPU).

Prints a table (function, worst per call, price, measured/price; the issue's shapes: time and outcome) and, as
the last line, one JSON object: functions measured, over_price (those whose worst time exceeds their price: must
be empty), max_ratio, and each shape's seconds and outcome.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sqlenv.sandbox.sandbox import Sandbox, SandboxError, SandboxSettings  # noqa: E402
from sqlenv.sandbox.limits import connection_limits  # noqa: E402
from sqlenv.sandbox.sql_costs import FUNCTION_PRICES, call_price  # noqa: E402

SETTINGS = SandboxSettings()
L = SETTINGS.max_value_bytes - 40  # the longest value a one-column row may hold (the record adds a few bytes)
P = SETTINGS.max_like_pattern_chars
A = SETTINGS.max_function_args
C = SETTINGS.max_value_bytes // 12 - 2  # the longest trim set SQLite allocates (12 bytes a character)
ARRAY = "[" + ",".join(["1"] * (L // 2 - 1)) + "]"  # the longest JSON array


def _object(n: int, prefix: str = "") -> str:
    return "{" + ",".join(f'"{prefix}{i}":1' for i in range(n)) + "}"


def _fit(build, limit: int) -> str:
    """The largest `build(n)` of at most `limit` bytes."""
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(build(mid).encode()) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return build(lo)


OBJECT = _fit(_object, L)

# Columns every expression may use (each a one-row subquery of its own, so each may be `max_value_bytes` long).
COLUMNS = {
    "x": "a" * L,                                  # the longest text
    "s": "b" * (C - 1) + "a",                      # a trim set whose only matching character comes last
    "g": "*[" + "b" * (P - 5) + "a]c",             # a GLOB class read whole at every position
    "k": "%" + "a" * (P - 2) + "b",                # a LIKE pattern that fails at its last character
    "h": "*" + "a" * (P - 2) + "b",                # the same for GLOB
    "e": "a" * (L // 2 - 1) + "b",                 # an instr/replace needle that fails at its last byte
    "j": ARRAY,                                    # the longest JSON array
    "o": OBJECT,                                   # a JSON object of as many keys as fit, patched by itself:
    "p": OBJECT,                                   # each key looked for among all the target's
    "w": "é" * (L // 2),                           # the longest text of 2-byte characters
    "m": "+" + "0" * (L - 8) + "1 days",           # a date modifier as long as a value may be
    "f": "%J" * (L // 50 - 1),                     # a strftime format whose output is as long as allowed
    "v": "a" * (L // 16),                          # a value 16 of which fit in one row (a window's rows)
    "u": "a" * (L // 33),                          # a value 32 of which (quoted) fit in one JSON text
    "n": 0.5,
}
_NUM = {"n": 0.5}

# The worst call of each function (the columns above as arguments).
_PATHS = ", ".join(["'$[#-1]'"] * (A - 1))
SHAPES = {
    "trim(2)": "trim(x, s)", "ltrim(2)": "ltrim(x, s)", "rtrim(2)": "rtrim(x, s)",
    "like(2)": "x LIKE k", "like(3)": "like(k, x, '!')", "glob(2)": "x GLOB g",
    "instr(2)": "instr(x, e)", "replace(3)": "replace(x, e, '')", "json_patch(2)": "json_patch(o, p)",
    "trim(1)": "trim(x)", "ltrim(1)": "ltrim(x)", "rtrim(1)": "rtrim(x)", "hex(1)": f"hex(substr(x, 1, {L // 2}))",
    "length(1)": "length(w)", "lower(1)": "lower(w)", "upper(1)": "upper(x)",
    "quote(1)": f"quote(substr(x, 1, {L - 4}))", "randomblob(1)": f"randomblob({L})", "zeroblob(1)": f"zeroblob({L})",
    "soundex(1)": "soundex(x)", "substr(2)": "substr(w, -1)", "substr(3)": "substr(w, -1, 1)",
    "substring(2)": "substring(w, -1)", "substring(3)": "substring(w, -1, 1)", "unicode(1)": "unicode(w)",
    "group_concat(1)": "group_concat(x)",
    "group_concat(2)": f"group_concat(substr(x, 1, {L // 2}), substr(x, 1, {L // 2}))",
    "max(1)": "max(x)", "min(1)": "min(x)",
    "first_value(1)": "first_value(v) OVER ()", "last_value(1)": "last_value(v) OVER ()",
    "nth_value(2)": "nth_value(v, 1) OVER ()", "lag(1)": "lag(v) OVER ()", "lag(2)": "lag(v, 1) OVER ()",
    "lag(3)": "lag(v, 1, v) OVER ()", "lead(1)": "lead(v) OVER ()", "lead(2)": "lead(v, 1) OVER ()",
    "lead(3)": "lead(v, 1, v) OVER ()",
    "current_date(0)": "current_date", "current_time(0)": "current_time", "current_timestamp(0)": "current_timestamp",
    "char(-1)": "char(" + ", ".join(["1114111"] * A) + ")",
    "coalesce(-1)": "coalesce(" + ", ".join(["NULL"] * (A - 1) + ["x"]) + ")",
    "max(-1)": "max(" + ", ".join(["x"] * A) + ")", "min(-1)": "min(" + ", ".join(["x"] * A) + ")",
    "strftime(-1)": "strftime(f, 'now'" + ", m" * (A - 2) + ")",
    **{f"{name}(-1)": f"{name}('now'" + ", m" * (A - 1) + ")"
       for name in ("date", "datetime", "julianday", "time", "unixepoch")},
    "json(1)": "json(j)", "json_array(-1)": "json_array(" + ", ".join(["u"] * A) + ")",
    "json_array_length(1)": "json_array_length(j)", "json_group_array(1)": "json_group_array(j)",
    "json_group_object(2)": "json_group_object('k', j)",
    "json_object(-1)": "json_object(" + ", ".join(["u"] * A) + ")", "json_quote(1)": "json_quote(x)",
    "json_type(1)": "json_type(j)", "json_valid(1)": "json_valid(j)",
    "->(2)": "j -> '$[#-1]'", "->>(2)": "j ->> '$[#-1]'", "json_array_length(2)": "json_array_length(j, '$')",
    "json_extract(-1)": f"json_extract(j, {_PATHS})", "json_remove(-1)": f"json_remove(j, {_PATHS})",
    "json_insert(-1)": "json_insert(j" + ", '$[#]', 1" * ((A - 1) // 2) + ")",
    "json_replace(-1)": "json_replace(j" + ", '$[#-1]', 1" * ((A - 1) // 2) + ")",
    "json_set(-1)": "json_set(j" + ", '$[#-1]', 1" * ((A - 1) // 2) + ")", "json_type(2)": "json_type(j, '$[#-1]')",
    # Numbers in, a number out.
    "count(0)": "count(*)", "count(1)": "count(x)", "avg(1)": "avg(n)", "sum(1)": "sum(n)", "total(1)": "total(n)",
    "cume_dist(0)": "cume_dist() OVER ()", "dense_rank(0)": "dense_rank() OVER ()", "ntile(1)": "ntile(3) OVER ()",
    "percent_rank(0)": "percent_rank() OVER ()", "rank(0)": "rank() OVER ()", "row_number(0)": "row_number() OVER ()",
    "ifnull(2)": "ifnull(NULL, n)", "iif(3)": "iif(n, n, n)", "likelihood(2)": "likelihood(n, 0.5)",
    "likely(1)": "likely(n)", "unlikely(1)": "unlikely(n)", "nullif(2)": "nullif(n, 1)", "round(1)": "round(n)",
    "round(2)": "round(n, 30)", "atan2(2)": "atan2(n, n)", "log(2)": "log(n, 8)", "mod(2)": "mod(n, 0.3)",
    "pow(2)": "pow(n, 0.5)", "power(2)": "power(n, 0.5)", "subtype(1)": "subtype(x)", "typeof(1)": "typeof(x)",
    "sqlite_compileoption_get(1)": "sqlite_compileoption_get(0)",
    "sqlite_compileoption_used(1)": "sqlite_compileoption_used('THREADSAFE')",
}
for _key in FUNCTION_PRICES:  # the rest: one number in, one out (or none)
    if _key not in SHAPES:
        _name, _args = _key[:-1].split("(")
        SHAPES[_key] = f"{_name}(" + ", ".join(["n"] * int(_args)) + ")"


# The issue's shapes: x of 9,000 characters, a trim set of 820, a GLOB class (within today's pattern limit).
ISSUE_COLUMNS = {"ix": "a" * 9000, "iy": "b" * 819 + "a", "ig": "*[" + "b" * (P - 5) + "a]c",
                 "iw": "*[" + "b" * 400 + "a]c"}  # (the last as long as patterns could be before: 500 bytes)


def probe_database(folder: Path) -> Path:
    """A database with one one-row table per column (`x(x)`, `s(s)`, ...): a row of all of them would pass the
    value limit, and values read from a table are never computed once for all calls."""
    path = folder / "probe" / "probe.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    for name, value in {**COLUMNS, **ISSUE_COLUMNS}.items():
        conn.execute(f"CREATE TABLE {name} ({name})")
        conn.execute(f"INSERT INTO {name} VALUES (?)", (value,))
    conn.commit()
    conn.close()
    return path


def row_sql(expr: str, calls: int) -> str:
    """One result row of `calls` calls of `expr`, reading the columns it names from their tables: one call a column
    up to 100 calls, past that summed in 100 columns (the sandbox's `max_columns` is 128; `+` calls nothing)."""
    names = sorted(set(re.findall(r"\b([a-z]{1,2})\b", expr)) & ({*COLUMNS, *ISSUE_COLUMNS}))
    per = -(-calls // 100)
    columns = ", ".join("+".join([f"({expr})" if per > 1 else expr] * min(per, calls - i))
                        for i in range(0, calls, per))
    return f"SELECT {columns} FROM {', '.join(names) or '(SELECT 1)'}"


def _connection(path: Path, settings: SandboxSettings) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False)
    for limit, value in connection_limits(settings).items():
        conn.setlimit(limit, value)
    return conn


def measure(conn: sqlite3.Connection, expr: str, calls: int, reps: int) -> tuple[float, str]:
    """The best per-call CPU time of `calls` calls of `expr` in one row, and SQLite's error if it failed."""
    sql = row_sql(expr, calls)
    best, error = float("inf"), ""
    for _ in range(reps):
        start = time.thread_time()
        try:
            conn.execute(sql).fetchall()
        except sqlite3.Error as err:
            error = str(err)
        best = min(best, time.thread_time() - start)
    return best / calls, error


def _timed(sandbox: Sandbox, sql: str) -> tuple[float, str]:
    start = time.monotonic()
    try:
        sandbox.execute("probe", sql)
        outcome = "ran"
    except SandboxError as err:
        outcome = str(err)[:110]
    return time.monotonic() - start, outcome


def longest_statement(conn: sqlite3.Connection, key: str) -> int:
    """The most calls of `key` one statement can hold: within `max_uninterruptible_s` at their price, within
    `max_sql_chars` and within `max_program_ops` (SQLite refuses a longer program when it prepares it)."""
    priced = int(SETTINGS.max_uninterruptible_s / call_price(key, SETTINGS) + 1e-9)

    def fits(n: int) -> bool:
        sql = row_sql(SHAPES[key], n)
        if len(sql) > SETTINGS.max_sql_chars:
            return False
        try:
            conn.execute("EXPLAIN " + sql).fetchall()
        except (sqlite3.Error, MemoryError):
            return False
        return True

    lo, hi = 1, priced
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def issue_shapes(conn: sqlite3.Connection) -> dict[str, str]:
    """The issue's shapes, then the longest statement of each costly function and one call more."""
    shapes = {"trim(x, y) x300 (x 9,000 chars, y 820)": row_sql("trim(ix, iy)", 300),
              "trim(x, y) x800": row_sql("trim(ix, iy)", 800),
              f"x GLOB '*[bbb...a]c' x300 ({P}-byte pattern)": row_sql("ix GLOB ig", 300)}
    for key in ("trim(2)", "glob(2)", "like(2)", "instr(2)", "replace(3)", "json_patch(2)", "json_remove(-1)",
                "julianday(-1)", "strftime(-1)"):
        n = longest_statement(conn, key)
        shapes[f"longest {key} statement: x{n}"] = row_sql(SHAPES[key], n)
        shapes[f"{key} x{n + 1}"] = row_sql(SHAPES[key], n + 1)
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8, help="calls per measured row (default 8)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions; the best counts (default 3)")
    parser.add_argument("--before", action="store_true", help="also time the issue's shapes as they ran before")
    args = parser.parse_args()
    if args.calls < 1 or args.reps < 1:
        parser.error("--calls and --reps must be >= 1")

    with tempfile.TemporaryDirectory() as tmp:
        path = probe_database(Path(tmp))
        conn = _connection(path, SETTINGS)
        rows, over, max_ratio = [], [], 0.0
        print(f"{'function':28s} {'worst/call':>11s} {'price':>9s} {'ratio':>6s}")
        for key in sorted(FUNCTION_PRICES):
            per_call, error = measure(conn, SHAPES[key], args.calls, args.reps)
            price = call_price(key, SETTINGS)
            ratio = per_call / price
            max_ratio = max(max_ratio, ratio)
            if ratio > 1:
                over.append(key)
            rows.append({"function": key, "worst_ms": round(per_call * 1000, 4),
                         "price_ms": round(price * 1000, 4), "error": error})
            print(f"{key:28s} {per_call * 1000:9.3f}ms {price * 1000:7.3f}ms {ratio:6.2f} {error[:40]}", flush=True)

        sandbox = Sandbox(path.parent.parent, SETTINGS)
        shapes = {}
        print(f"\nthrough the sandbox (time limit {SETTINGS.timeout_s:g} s, "
              f"max_uninterruptible_s {SETTINGS.max_uninterruptible_s:g}): wall s, CPU s, outcome")
        for name, sql in issue_shapes(conn).items():
            cpu = time.thread_time()
            seconds, outcome = _timed(sandbox, sql)
            cpu = time.thread_time() - cpu
            shapes[name] = {"s": round(seconds, 3), "cpu_s": round(cpu, 3), "outcome": outcome}
            print(f"  {name:48s} {seconds:7.3f} {cpu:7.3f}  {outcome}", flush=True)
        sandbox.close()
        if args.before:
            old = _connection(path, SandboxSettings(max_like_pattern_chars=500))
            print("\nbefore (a plain connection as the sandbox's was: LIKE patterns of 500 bytes, no pricing):")
            before = {"trim(x, y) x300": row_sql("trim(ix, iy)", 300),
                      "trim(x, y) x800": row_sql("trim(ix, iy)", 800),
                      "x GLOB '*[bbb...a]c' x300 (405-byte pattern)": row_sql("ix GLOB iw", 300)}
            for name, sql in before.items():
                start, cpu = time.monotonic(), time.thread_time()
                old.execute(sql).fetchall()
                seconds, cpu = time.monotonic() - start, time.thread_time() - cpu
                shapes["before " + name] = {"s": round(seconds, 3), "cpu_s": round(cpu, 3), "outcome": "ran"}
                print(f"  {name:48s} {seconds:7.3f} {cpu:7.3f}", flush=True)
            old.close()
        conn.close()
    print(json.dumps({"functions": len(rows), "over_price": over, "max_ratio": round(max_ratio, 3),
                      "max_uninterruptible_s": SETTINGS.max_uninterruptible_s, "shapes": shapes}))


if __name__ == "__main__":
    main()
