"""The read-only SQL sandbox: every line of SQL safety in SQLEnv lives in this module.

Model-written SQL runs here, so the executor is defensive in depth (Datasette-style named limits):

1. Text checks before SQLite sees anything, cheap enough for every step: length cap, no NUL bytes, valid
   UTF-8, and the first word (after comments) must be SELECT or WITH.
2. Exactly one statement: the `sqlite3` module refuses a statement followed by another one before running
   anything ("You can only execute one statement at a time").
3. The database is opened through a `file:...?mode=ro` URI with `PRAGMA query_only=1`.
4. An authorizer callback allows only reads, functions and recursive CTEs (no ATTACH, PRAGMA, writes).
5. A statement that runs past `timeout_s` is interrupted: a watchdog thread calls `Connection.interrupt()` at
   its deadline (SQLite stops at its next jump, even while this process's threads fight over the interpreter
   lock), and a progress handler checks the clock too.
6. SQLite's own limits (`Connection.setlimit`) bound what runs between two such checks: short values (an
   `instr` over two of them is well under a millisecond), small programs, shallow expressions, few compound
   SELECTs, no ATTACH.
7. Temporary tables, sorts and CTE queues live in memory (`temp_store = MEMORY`), under SQLite's process-wide
   hard heap limit: a query writes no temporary file, and one that needs too much memory fails alone. When a
   statement finds the heap already full of other statements' memory, the longest-running of those is stopped
   to make room and the statement runs once more within its own time limit (`_make_room`): a small query is not
   failed by a big one next to it.
8. Rows are fetched in batches and at most `max_scoring_rows` are held; values and texts are cut.

When SQLite refuses a query, the full text check (`check_sql`, on sqlglot's tokens) runs to say why in
words the agent can act on ("Only one SQL statement is allowed per QUERY", "... DELETE is not"). Repeated
queries are spotted on a cheap normal form (`normalize_sql`, one regular expression), not on a parse.

Database names come from question files, so they are validated and resolved to stay inside `db_dir`.
"""

from __future__ import annotations

import ctypes
import functools
import heapq
import os
import re
import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType


@dataclass
class SandboxSettings:
    """Limits of the SQL sandbox. Every number that bounds time, memory or text is named here.

    Args:
        timeout_s: Wall-clock seconds one statement may run before it is interrupted (default 5.0).
            Checked by SQLite's progress handler, so runaway recursive CTEs and huge cross joins stop.
        progress_interval: SQLite virtual-machine instructions between two clock checks of the progress handler
            (default 4000), the second line behind the watchdog's interrupt at the deadline. Either stops a
            statement at its next jump; what runs until then is bounded by the limits below (the costliest
            call, an `instr`/`replace` over two `max_value_bytes` strings, takes about 0.4 ms).
        max_display_rows: Result rows shown in a QUERY observation (default 20); the rest are counted as
            "(N more rows)".
        sample_rows: Rows shown by SAMPLE (default 5).
        max_scoring_rows: Most result rows held in memory for progress scoring and display (default 10_000).
            Rows past this are counted (while the time limit allows) but not kept.
        count_rows_past_cap: Keep counting rows beyond `max_scoring_rows` so "(N more rows)" is exact
            (default True). Counting holds no rows; the time limit still applies.
        fetch_batch_rows: Rows fetched per `fetchmany` call (default 256).
        max_observation_chars: Longest observation text (default 2000); longer text is cut with a marker.
        max_cell_chars: Longest single value shown in a result cell (default 80).
        max_sql_chars: Longest SQL text accepted (default 20_000); longer arguments get an error.
        max_value_bytes: SQLite's SQLITE_LIMIT_LENGTH for the connection (default 10_000): no string, blob or
            row built or read by a query (e.g. `zeroblob`, `group_concat`) may exceed it. It bounds the cost of one
            function call, which runs inside one VM instruction out of the time check's reach: `instr` and
            `replace` are quadratic in it (1 MB strings took 3 s a call). Spider's longest value is 213 bytes.
        max_program_ops: SQLite's SQLITE_LIMIT_VDBE_OP (default 4_000): most instructions in one prepared
            statement, so a query cannot line up thousands of costly calls between two time checks (CTEs
            copied into every reference, long select lists). Spider's gold queries need at most 131.
        max_expr_depth: SQLite's SQLITE_LIMIT_EXPR_DEPTH (default 100; Spider's gold SQL nests a few levels).
        max_compound_selects: SQLite's SQLITE_LIMIT_COMPOUND_SELECT (default 20): terms in one UNION/EXCEPT chain.
        max_function_args: SQLite's SQLITE_LIMIT_FUNCTION_ARG (default 32).
        max_heap_bytes: SQLite's hard heap limit (default 512 MiB), where temporary tables, sorts and CTE queues
            live (`temp_store = MEMORY`: no temporary files). A query that needs more fails with "out of memory";
            the memory is given back at once. The limit is process-wide (SQLite has one heap, shared by every
            session) and can only be lowered: the smallest limit of any sandbox in the process holds. A statement
            that finds it full of other statements' memory gets room by stopping the one that has run longest.
        max_like_pattern_chars: SQLite's SQLITE_LIMIT_LIKE_PATTERN_LENGTH (default 500), which bounds the
            cost of one LIKE/GLOB comparison (it runs inside one VM instruction, out of the time check's reach).
        max_result_bytes: Most bytes of result rows held for scoring (default 32_000_000, estimated per batch);
            past it rows are counted but not kept, like past `max_scoring_rows`.
        max_open_databases: Connections kept open per sandbox (default 64, least recently used closed). A
            reopened connection starts with cold caches, so keep this above the number of databases in use.
        statement_cache_size: Prepared statements cached per connection (default 256): repeated queries
            skip SQLite's prepare step.
    """

    timeout_s: float = 5.0
    progress_interval: int = 4000
    max_display_rows: int = 20
    sample_rows: int = 5
    max_scoring_rows: int = 10_000
    count_rows_past_cap: bool = True
    fetch_batch_rows: int = 256
    max_observation_chars: int = 2000
    max_cell_chars: int = 80
    max_sql_chars: int = 20_000
    max_value_bytes: int = 10_000
    max_program_ops: int = 4_000
    max_expr_depth: int = 100
    max_compound_selects: int = 20
    max_function_args: int = 32
    max_heap_bytes: int = 512 * 1024 * 1024
    max_result_bytes: int = 32_000_000
    max_like_pattern_chars: int = 500
    max_open_databases: int = 64
    statement_cache_size: int = 256

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"SandboxSettings.timeout_s must be > 0, got {self.timeout_s}")
        for name in ("progress_interval", "max_display_rows", "sample_rows", "max_scoring_rows", "fetch_batch_rows",
                     "max_observation_chars", "max_cell_chars", "max_sql_chars", "max_value_bytes",
                     "max_result_bytes", "max_like_pattern_chars", "max_open_databases", "max_program_ops",
                     "max_expr_depth", "max_compound_selects", "max_function_args", "max_heap_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SandboxSettings.{name} must be >= 1, got {getattr(self, name)}")


TRUNCATION_MARKER = " …[truncated]"

_DB_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")

# Keywords that never belong in a read-only query (checked on tokens, so names inside strings are fine).
_FORBIDDEN_TOKENS = {
    TokenType.INSERT: "INSERT",
    TokenType.UPDATE: "UPDATE",
    TokenType.DELETE: "DELETE",
    TokenType.CREATE: "CREATE",
    TokenType.DROP: "DROP",
    TokenType.ALTER: "ALTER",
    TokenType.PRAGMA: "PRAGMA",
    TokenType.ATTACH: "ATTACH",
    TokenType.DETACH: "DETACH",
}

# Authorizer: what a user query may do: read, call functions, recurse. Nothing else (no PRAGMA functions).
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                    getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
# printf/format: one call with a huge width (printf('%.900000000c', 'x')) runs for many seconds inside a
# single VM instruction, where the progress handler cannot stop it. Spider's gold SQL never uses them.
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "printf", "format"}


class SandboxError(Exception):
    """A query the sandbox refuses or that failed; its message is shown to the agent."""


@dataclass(slots=True)
class QueryResult:
    """A statement's result: column names, the kept rows (≤ max_scoring_rows) and the total row count."""

    columns: list[str]
    rows: list[tuple]
    n_rows: int
    truncated: bool = False  # rows were dropped past max_scoring_rows (n_rows may be a lower bound)
    elapsed_s: float = 0.0


@dataclass
class TableInfo:
    """Schema of one table: `columns` as (name, type, is_pk) and `foreign_keys` as col -> 'table.col'."""

    name: str
    columns: list[tuple[str, str, bool]]
    foreign_keys: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SQLCheck:
    """The cached verdict of the full text check on one SQL string (`error` is None when it passes)."""

    error: str | None


# ----------------------------------------------------------------------------------------- SQL text checks

def _clean_for_display(text: str, limit: int = 200) -> str:
    """A printable, valid-UTF-8 one-line excerpt of any argument (NULs and lone surrogates replaced)."""
    text = text[: limit * 4]  # bounded work whatever the argument's size
    text = text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text_refusal(sql: str, max_sql_chars: int) -> str | None:
    """Why `sql` cannot even be looked at (empty, too long, a NUL byte, not UTF-8), or None. O(len) in C."""
    if not sql or sql.isspace():
        return "Empty SQL: give one SELECT statement."
    if len(sql) > max_sql_chars:
        return f"SQL too long ({len(sql)} characters, limit {max_sql_chars})."
    if "\x00" in sql:
        return "SQL contains a NUL byte."
    if not sql.isascii():
        try:
            sql.encode("utf-8")
        except UnicodeEncodeError:
            return "SQL is not valid UTF-8 text."
    return None


def _starts_select_or_with(sql: str) -> bool:
    """Whether the first word of `sql`, after whitespace and comments, is SELECT or WITH. A plain scan (no
    regular expression: linear on any input); an unterminated comment is no statement at all."""
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace():
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end < 0:
                return False
            i = end + 2
        else:
            break
    for word in ("select", "with"):
        end = i + len(word)
        if sql[i:end].lower() == word and (end >= n or not (sql[end].isalnum() or sql[end] in "_$")):
            return True
    return False


def quick_check(sql: str, max_sql_chars: int = 20_000) -> bool:
    """The per-step text check: True when `sql` may go to SQLite (not empty or too long, no NUL, valid UTF-8,
    first word SELECT or WITH). SQLite itself enforces the rest (one statement, read-only, authorizer);
    when either refuses, `check_sql` explains why."""
    return _text_refusal(sql, max_sql_chars) is None and _starts_select_or_with(sql)


@functools.lru_cache(maxsize=1024)
def check_sql(sql: str, max_sql_chars: int = 20_000) -> SQLCheck:
    """The full text check: is `sql` exactly one read-only SELECT / WITH ... SELECT statement (cached)?

    The text is split into statements on sqlglot's tokens (so semicolons inside strings and comments don't
    count), the statement must start with SELECT or WITH and contain no write/PRAGMA/ATTACH keyword, and
    `sqlite3.complete_statement` must agree it is complete. It runs when `quick_check` or SQLite refused a
    query, to name the reason; the connection's authorizer and read-only mode enforce the rules either way.
    """
    refusal = _text_refusal(sql, max_sql_chars)
    if refusal:
        return SQLCheck(refusal)
    try:
        tokens = sqlglot.tokenize(sql, read="sqlite")
    except Exception as err:  # sqlglot raises TokenError on unterminated strings etc.
        return SQLCheck(f"SQL syntax error: {_clean_for_display(str(err), 160)}")
    statements: list[list] = [[]]
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            statements.append([])
        else:
            statements[-1].append(token)
    statements = [s for s in statements if s]
    if not statements:
        return SQLCheck("Empty SQL: give one SELECT statement.")
    if len(statements) > 1:
        return SQLCheck("Only one SQL statement is allowed per QUERY.")
    first = statements[0][0]
    if first.token_type not in (TokenType.SELECT, TokenType.WITH):
        word = first.text.upper()[:20]
        return SQLCheck(f"Only read-only SELECT (or WITH ... SELECT) queries are allowed, not {word}.")
    # Inside the statement: a write after WITH (WITH x AS (...) DELETE ...). Other words (VACUUM, BEGIN...)
    # can only start a statement, which the checks above already refuse; names such as "release" stay legal.
    body = statements[0]
    for i, token in enumerate(body):
        bad = _FORBIDDEN_TOKENS.get(token.token_type)
        if bad is None and token.token_type == TokenType.REPLACE and i + 1 < len(body) \
                and body[i + 1].token_type == TokenType.INTO:
            bad = "REPLACE INTO"  # replace() the function is fine
        if bad is not None:
            return SQLCheck(f"Only read-only SELECT queries are allowed ({bad} is not).")
    # SQLite's own view of completeness: catches unterminated strings / comments the tokenizer tolerated.
    if not sqlite3.complete_statement(sql.rstrip().rstrip(";") + "\n;"):
        return SQLCheck("Incomplete SQL statement (unterminated string, comment or parenthesis?).")
    return SQLCheck(None)


# The parts of a query kept as written in its normal form: quoted strings and names ('Bob' and 'bob' differ,
# and SQLite reads an unknown "x" as a string), and comments (dropped). Every alternative is linear.
_QUOTED_OR_COMMENT = re.compile(r"""('(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?"""
                                r"""|--[^\n]*|/\*(?:[^*]|\*(?!/))*(?:\*/)?)""")
# Tokens of the rest: a run of word characters or one other character.
_WORD_OR_CHAR = re.compile(r"[\w$]+|\S")


@functools.lru_cache(maxsize=8192)
def normalize_sql(sql: str, max_sql_chars: int = 20_000) -> str:
    """The normal form of `sql`, used to spot repeated queries: one space between tokens, comments and
    trailing semicolons gone, keywords and bare names lower-case (SQLite's are case-insensitive), quoted
    strings and names as written. A few microseconds (regular expressions, no parse), cached per text; at
    most `max_sql_chars` characters are read."""
    sql = sql[: max_sql_chars + 1]
    if "'" in sql or '"' in sql or "`" in sql or "[" in sql or "--" in sql or "/*" in sql:
        tokens = []
        for i, part in enumerate(_QUOTED_OR_COMMENT.split(sql)):
            if i % 2 == 0:
                tokens += _WORD_OR_CHAR.findall(part.lower())
            elif not part.startswith(("--", "/*")):
                tokens.append(part)
    else:  # no quotes or comments (the common case): one pass over the lower-cased text
        tokens = _WORD_OR_CHAR.findall(sql.lower())
    while tokens and tokens[-1] == ";":
        tokens.pop()
    return " ".join(tokens)


@functools.lru_cache(maxsize=4096)
def has_top_level_order_by(sql: str) -> bool:
    """Whether a query's result order is meaningful: its sqlglot parse has a top-level ORDER BY."""
    if not sql:
        return False
    try:
        trees = [t for t in sqlglot.parse(sql, read="sqlite") if t is not None and not isinstance(t, exp.Semicolon)]
    except (SqlglotError, RecursionError, ValueError):
        return False
    return len(trees) == 1 and bool(trees[0].args.get("order"))


# ------------------------------------------------------------------------------------------- path checks

def resolve_database_path(db_dir: str | Path, name: str) -> Path:
    """The SQLite file of database `name` inside `db_dir` (`<db_dir>/<name>/<name>.sqlite`, or a flat
    `<db_dir>/<name>.sqlite`). Names with path separators, '..' or odd characters are refused, and the
    resolved path must stay inside `db_dir` (symlinks included)."""
    if not isinstance(name, str) or not _DB_NAME_RE.match(name) or ".." in name:
        raise SandboxError(f"Invalid database name {_clean_for_display(str(name), 60)!r}.")
    root = Path(db_dir).resolve()
    for candidate in (root / name / f"{name}.sqlite", root / f"{name}.sqlite"):
        resolved = candidate.resolve()
        if not resolved.is_relative_to(root):
            raise SandboxError(f"Database {name!r} resolves outside the database folder.")
        if resolved.is_file():
            return resolved
    raise SandboxError(f"Database {name!r} not found in {root}.")


# ------------------------------------------------------------------------------------------- formatting

def format_value(value: Any, max_chars: int = 80) -> str:
    """One result cell as text: NULL for None, floats without noise, long values cut."""
    if value is None:
        text = "NULL"
    elif isinstance(value, float):
        text = repr(round(value, 6)) if abs(value) < 1e15 else repr(value)
        if text.endswith(".0"):
            text = text[:-2]
    elif isinstance(value, bytes):
        text = f"<blob {len(value)} bytes>"
    else:
        text = str(value)
    if "\n" in text or "\r" in text or "\x00" in text:
        text = text.replace("\r", " ").replace("\n", " ").replace("\x00", "\\0")
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text


_PLAIN_TYPES = {int, str}


def format_rows(columns: list[str], rows: list[tuple], n_total: int, max_rows: int, max_cell_chars: int = 80,
                approximate: bool = False) -> str:
    """A compact text table: header `a | b`, one line per row, then "(N more rows)" when cut."""
    header = " | ".join(columns)
    if not header.isprintable() or (len(header) > max_cell_chars and max(map(len, columns)) > max_cell_chars):
        header = " | ".join(format_value(str(c), max_cell_chars) for c in columns)
    lines = [header]
    for row in rows[:max_rows]:
        # Fast path (C-level joins) for rows of ints and short single-line strings, the common case.
        if set(map(type, row)) <= _PLAIN_TYPES:
            cells = list(map(str, row))
            line = " | ".join(cells)
            if (len(line) <= max_cell_chars or max(map(len, cells)) <= max_cell_chars) \
                    and "\n" not in line and "\r" not in line and "\x00" not in line:
                lines.append(line)
                continue
        lines.append(" | ".join(format_value(v, max_cell_chars) for v in row))
    shown = min(len(rows), max_rows)
    if n_total > shown:
        more = n_total - shown
        lines.append(f"({more}{'+' if approximate else ''} more rows)")
    if n_total == 0:
        lines.append("(0 rows)")
    return "\n".join(lines)


def cut_text(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, ending with a visible marker when it was cut."""
    if len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - len(TRUNCATION_MARKER))] + TRUNCATION_MARKER


# --------------------------------------------------------------------------------------------- executor

def _authorizer(action: int, arg1: Any, arg2: Any, db_name: Any, source: Any) -> int:
    if action in _ALLOWED_ACTIONS:
        if action == sqlite3.SQLITE_FUNCTION and isinstance(arg2, str) and arg2.lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _row_bytes(row: tuple) -> int:
    return sum(len(v) if type(v) is str or type(v) is bytes else 8 for v in row) + 16


def _sample_row_bytes(chunk: list) -> float:
    """Average size of a row in `chunk`, from its first, middle and last rows."""
    return (_row_bytes(chunk[0]) + _row_bytes(chunk[len(chunk) // 2]) + _row_bytes(chunk[-1])) / 3


def _connection_limits(settings: SandboxSettings) -> dict[int, int]:
    """SQLite's own limits for a sandbox connection (`Connection.setlimit`), from the settings."""
    return {
        sqlite3.SQLITE_LIMIT_LENGTH: settings.max_value_bytes,
        sqlite3.SQLITE_LIMIT_SQL_LENGTH: 4 * settings.max_sql_chars + 64,  # UTF-8 bytes of the longest SQL text
        sqlite3.SQLITE_LIMIT_VDBE_OP: settings.max_program_ops,
        sqlite3.SQLITE_LIMIT_EXPR_DEPTH: settings.max_expr_depth,
        sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: settings.max_compound_selects,
        sqlite3.SQLITE_LIMIT_FUNCTION_ARG: settings.max_function_args,
        sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: settings.max_like_pattern_chars,
        sqlite3.SQLITE_LIMIT_ATTACHED: 0,
    }


def _lower_heap_limit(conn: sqlite3.Connection, limit: int) -> None:
    """Set SQLite's process-wide hard heap limit to `limit` bytes unless a lower one is already set, and the soft
    limit to half of it: past the soft limit SQLite gives back page-cache memory before allocations fail."""
    current = conn.execute("PRAGMA hard_heap_limit").fetchone()[0]
    if current == 0 or current > limit:
        conn.execute(f"PRAGMA hard_heap_limit = {int(limit)}")
        conn.execute(f"PRAGMA soft_heap_limit = {int(limit) // 2}")


# Past this share of the hard heap limit, a statement short of memory is short because of others: one of them is
# stopped. Below it, the statement was too big by itself (or its program too long) and fails at once.
_HEAP_FULL_SHARE = 0.75


class _HeapGauge:
    """SQLite's process-wide heap: bytes in use and the hard limit, read from the very C library the `sqlite3`
    module runs on (`sqlite3_memory_used`, `sqlite3_hard_heap_limit64` through ctypes; Python exposes neither).

    The library is reached through the `_sqlite3` extension's own handle, whose symbol lookup also searches the
    libraries it was linked with, so it is the same SQLite whether linked statically or as `libsqlite3`. Where
    the symbols cannot be found (or the versions disagree), `usage()` is None and no statement is stopped for
    memory: a statement short of it fails alone, as without this gauge."""

    def __init__(self) -> None:
        self._used = self._limit = None
        try:
            import _sqlite3  # the extension module itself: its handle's lookup reaches the SQLite it runs on

            lib = ctypes.CDLL(_sqlite3.__file__)
            version, used, limit = lib.sqlite3_libversion_number, lib.sqlite3_memory_used, lib.sqlite3_hard_heap_limit64
        except (ImportError, OSError, AttributeError):
            return
        version.restype, version.argtypes = ctypes.c_int, []
        used.restype, used.argtypes = ctypes.c_int64, []
        limit.restype, limit.argtypes = ctypes.c_int64, [ctypes.c_int64]
        major, minor, patch = sqlite3.sqlite_version_info
        if version() == major * 1_000_000 + minor * 1_000 + patch:
            self._used, self._limit = used, limit

    def usage(self) -> tuple[int, int] | None:
        """(bytes in use, hard limit), or None where unreadable or no hard limit is set."""
        if self._used is None:
            return None
        limit = self._limit(-1)  # a negative argument reads the limit without changing it
        return (self._used(), limit) if limit > 0 else None

    def mostly_held(self) -> bool:
        """Whether at least `_HEAP_FULL_SHARE` of the hard limit is in use (False where unreadable)."""
        usage = self.usage()
        return usage is not None and usage[0] >= usage[1] * _HEAP_FULL_SHARE


_HEAP = _HeapGauge()


class _Watchdog:
    """One daemon thread per process that interrupts statements at their deadlines (`sqlite3_interrupt`).

    The progress handler alone checks the clock only when SQLite calls back into Python, which needs the
    interpreter lock: with many sessions' statements running at once (each releases the lock inside SQLite)
    those checks were late by seconds on a loaded machine. The interrupt flag is read by SQLite itself at
    every jump, with no lock to take."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Empty and threadless: at start, and in a forked child (which inherits no threads)."""
        self._heap: list[tuple[float, int, Any]] = []
        self._count = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, db: "_Database", deadline: float) -> None:
        with self._wake:
            self._count += 1
            heapq.heappush(self._heap, (deadline, self._count, weakref.ref(db)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sqlenv-sandbox-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][1] == self._count:  # a new earliest deadline: wake up sooner
                self._wake.notify()

    # Deadlines due within this many seconds are handled in one wake-up: thousands of short statements a second
    # cost a few dozen wake-ups, not one each (a late interrupt is late by at most this much).
    GRANULARITY_S = 0.05

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(None if not self._heap
                                    else self._heap[0][0] - time.monotonic() + self.GRANULARITY_S)
                due = []
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    deadline, _, ref = heapq.heappop(self._heap)
                    due.append((deadline, ref))
            for deadline, ref in due:  # statements that ended long ago have another deadline (or none): skipped
                db = ref()
                if db is not None and db.deadline == deadline:
                    db.interrupt_if_due(deadline)

    def stop_oldest(self, before: float) -> bool:
        """Interrupt, to free its memory, the running statement with the earliest deadline earlier than `before`
        (the one that has run longest, when time limits are alike); False when there is none."""
        with self._wake:
            running = [(deadline, db) for deadline, _, ref in self._heap
                       if deadline < before and (db := ref()) is not None and db.deadline == deadline]
        for deadline, db in sorted(running, key=lambda item: item[0]):
            if db.interrupt_if_due(deadline, for_memory=True):
                return True
        return False


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG._reset)


class _DecodeError(Exception):
    pass


class _OutOfMemory(Exception):
    pass


def _make_room(deadline: float, settle_s: float = 0.5, poll_s: float = 0.01) -> bool:
    """After a statement (or a connection being opened) ran out of SQLite's shared heap and gave back what it
    held: whether to try it once more. When the heap is still mostly held by others, the running statement that has
    run longest (its deadline before `deadline`) is stopped, and this waits for its memory to come back (at most
    `settle_s`). No when the statement was too big by itself, when no older statement runs, or when time is up.

    Callers make room once per statement: SQLite reports a program past `max_program_ops` as out of memory too,
    and such a statement, sent while the heap is full, must not stop one statement after another."""
    if not _HEAP.mostly_held() or not _WATCHDOG.stop_oldest(before=deadline):
        return False
    settled = min(deadline, time.monotonic() + settle_s)
    while _HEAP.mostly_held() and time.monotonic() < settled:
        time.sleep(poll_s)
    return time.monotonic() < deadline


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class _Database:
    """One read-only connection plus its schema, owned by one `Sandbox`."""

    def __init__(self, path: Path, settings: SandboxSettings):
        self.path = path
        self.settings = settings
        stat = path.stat()
        # The file this connection reads, as of opening (a file replaced later is a new identity once reopened):
        # keys caches of results derived from it, without a stat per use.
        self.identity = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
        uri = path.as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                               cached_statements=max(0, settings.statement_cache_size))
        try:
            conn.execute("PRAGMA query_only = 1")
            # Sorts, temporary tables and CTE queues in memory, under the heap limit: never a temporary file
            # (one ORDER BY over a CTE of blobs wrote 336 MB in 2 s to disk).
            conn.execute("PRAGMA temp_store = MEMORY")
            _lower_heap_limit(conn, settings.max_heap_bytes)
            self.tables: dict[str, TableInfo] = self._read_schema(conn)
            for limit, value in _connection_limits(settings).items():
                conn.setlimit(limit, value)
            conn.set_authorizer(_authorizer)
        except Exception:
            conn.close()
            raise
        self.conn = conn
        self.deadline = float("inf")
        self.deadline_lock = threading.Lock()  # the watchdog interrupts only the statement whose deadline passed
        self.stopped_for_memory = False  # the running statement was interrupted to free memory, not at its deadline
        conn.set_progress_handler(self._on_progress, max(1, settings.progress_interval))
        self.row_counts: dict[str, int] = {}

    def _on_progress(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0  # non-zero interrupts the statement

    def start_statement(self, deadline: float) -> float:
        """Arm the time limit of the statement about to run (a `time.monotonic()` deadline); returns its start."""
        with self.deadline_lock:
            self.deadline = deadline
            self.stopped_for_memory = False
        _WATCHDOG.watch(self, deadline)
        return time.monotonic()

    def end_statement(self) -> None:
        with self.deadline_lock:
            self.deadline = float("inf")

    def interrupt_if_due(self, deadline: float, for_memory: bool = False) -> bool:
        """(The watchdog.) Interrupt the running statement if it is the one armed with `deadline`; whether it was."""
        with self.deadline_lock:
            if self.deadline != deadline:
                return False
            self.stopped_for_memory = for_memory
            try:
                self.conn.interrupt()
            except sqlite3.ProgrammingError:  # closed meanwhile
                return False
            return True

    @staticmethod
    def _read_schema(conn: sqlite3.Connection) -> dict[str, TableInfo]:
        # Schema introspection runs before the authorizer is installed (it needs PRAGMAs).
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table','view') AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid")]
        tables = {}
        for name in names:
            quoted = '"' + name.replace('"', '""') + '"'
            cols = [(r[1], (r[2] or "").upper(), bool(r[5])) for r in conn.execute(f"PRAGMA table_info({quoted})")]
            fks = {}
            for r in conn.execute(f"PRAGMA foreign_key_list({quoted})"):
                fks[r[3]] = f"{r[2]}.{r[4]}" if r[4] else str(r[2])
            tables[name] = TableInfo(name, cols, fks)
        return tables

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


class Sandbox:
    """Read-only executor over the databases in `db_dir`. One instance per environment; thread-safe.

    Methods never let an SQLite or sqlglot exception escape except as `SandboxError` with a readable message.
    """

    def __init__(self, db_dir: str | Path, settings: SandboxSettings | None = None):
        self.db_dir = Path(db_dir)
        self.settings = settings or SandboxSettings()
        self._dbs: OrderedDict[str, _Database] = OrderedDict()
        self._lock = threading.RLock()

    # -- connections
    def database(self, name: str) -> _Database:
        with self._lock:
            db = self._dbs.get(name)
            if db is not None:
                self._dbs.move_to_end(name)
                return db
            path = resolve_database_path(self.db_dir, name)
            deadline, made_room = time.monotonic() + self.settings.timeout_s, False
            while True:
                try:
                    db = _Database(path, self.settings)
                    break
                except MemoryError:  # the process-wide heap limit, reached by other statements right now
                    if made_room or not _make_room(deadline):
                        raise SandboxError(f"Cannot open database {name!r} now: the sandbox is out of memory; "
                                           "try again.") from None
                    made_room = True
                except (sqlite3.Error, OSError) as err:
                    raise SandboxError(f"Cannot open database {name!r}: {err}") from None
            self._dbs[name] = db
            while len(self._dbs) > max(1, self.settings.max_open_databases):
                _, old = self._dbs.popitem(last=False)
                old.close()
            return db

    def close(self) -> None:
        with self._lock:
            for db in self._dbs.values():
                db.close()
            self._dbs.clear()

    def __del__(self):  # connections are cheap but file handles are not unlimited
        try:
            self.close()
        except Exception:
            pass

    # -- schema
    def table_names(self, db_name: str) -> list[str]:
        return list(self.database(db_name).tables)

    def find_table(self, db_name: str, table: str) -> TableInfo:
        """The table called `table` (case-insensitive, surrounding quotes/brackets ignored)."""
        db = self.database(db_name)
        key = table.strip().strip(";").strip().strip('"`[]\'').strip().lower()
        for name, info in db.tables.items():
            if name.lower() == key:
                return info
        listing = ", ".join(db.tables) or "(none)"
        raise SandboxError(f"Unknown table {_clean_for_display(table, 60)!r}. Tables: {listing}")

    def row_count(self, db_name: str, table: str) -> int:
        with self._lock:
            db = self.database(db_name)
            if table not in db.row_counts:
                quoted = '"' + table.replace('"', '""') + '"'
                result = self._run(db, f"SELECT count(*) FROM {quoted}", max_rows=1)
                db.row_counts[table] = int(result.rows[0][0]) if result.rows else 0
            return db.row_counts[table]

    def describe(self, db_name: str, table: str) -> str:
        """DESCRIBE text: one line per column `name TYPE [PK] [-> other.col]`, then `rows: N`."""
        info = self.find_table(db_name, table)
        lines = [f"table {info.name}"]
        for name, ctype, pk in info.columns:
            parts = [name, ctype or "ANY"]
            if pk:
                parts.append("PK")
            if name in info.foreign_keys:
                parts.append(f"-> {info.foreign_keys[name]}")
            lines.append(" ".join(parts))
        try:
            lines.append(f"rows: {self.row_count(db_name, info.name)}")
        except SandboxError:  # a table too big to count in time still gets its columns described
            lines.append("rows: unknown (count timed out)")
        return cut_text("\n".join(lines), self.settings.max_observation_chars)

    def sample(self, db_name: str, table: str) -> str:
        """SAMPLE text: the first `sample_rows` rows of a table as a text table."""
        info = self.find_table(db_name, table)
        quoted = '"' + info.name.replace('"', '""') + '"'
        with self._lock:
            result = self._run(self.database(db_name), f"SELECT * FROM {quoted} LIMIT {int(self.settings.sample_rows)}",
                               max_rows=self.settings.sample_rows)
        text = format_rows(result.columns, result.rows, result.n_rows, self.settings.sample_rows,
                           self.settings.max_cell_chars)
        return cut_text(text, self.settings.max_observation_chars)

    # -- queries
    def execute(self, db_name: str, sql: str, max_rows: int | None = None) -> QueryResult:
        """Run one checked, read-only statement; raises `SandboxError` with a message for the agent."""
        if not isinstance(sql, str):
            raise SandboxError("SQL must be text.")
        limit = self.settings.max_sql_chars
        if not quick_check(sql, limit):
            raise SandboxError(check_sql(sql, limit).error
                               or "Only read-only SELECT (or WITH ... SELECT) queries are allowed.")
        cap = self.settings.max_scoring_rows if max_rows is None else max_rows
        try:
            with self._lock:  # no other thread may close this connection (LRU) between lookup and run
                return self._run(self.database(db_name), sql, max_rows=cap)
        except SandboxError as err:
            # SQLite refused or failed it: the full text check may name the reason better (a second
            # statement, a write keyword); otherwise SQLite's own message stands.
            reason = check_sql(sql, limit).error
            if reason:
                raise SandboxError(reason) from None
            raise err from None

    def render(self, result: QueryResult) -> str:
        """QUERY observation text for a result (≤ max_display_rows rows, cut to max_observation_chars)."""
        text = format_rows(result.columns, result.rows, result.n_rows, self.settings.max_display_rows,
                           self.settings.max_cell_chars, approximate=result.truncated)
        return cut_text(text, self.settings.max_observation_chars)

    def _run(self, db: _Database, sql: str, max_rows: int) -> QueryResult:
        settings = self.settings
        deadline = time.monotonic() + settings.timeout_s  # one time limit for the statement, however often it runs
        made_room = False
        while True:
            try:
                return self._run_once(db, sql, max_rows, deadline)
            except _DecodeError:
                # Some real databases hold invalid UTF-8 text: switch this connection to lenient decoding
                # (slower, so only where needed) and run again.
                db.conn.text_factory = _lenient_text
            except _OutOfMemory:  # SQLITE_NOMEM: the heap limit, or a program past max_program_ops
                if made_room or not _make_room(deadline):
                    raise SandboxError(
                        f"Query too large or needs too much memory (limits: {settings.max_program_ops} SQLite "
                        f"instructions, {settings.max_heap_bytes // 2**20} MiB shared by all sessions); simplify "
                        "it.") from None
                made_room = True

    def _run_once(self, db: _Database, sql: str, max_rows: int, deadline: float) -> QueryResult:
        settings = self.settings
        with self._lock:
            start = db.start_statement(deadline)
            cursor = None
            try:
                cursor = db.conn.execute(sql)
                columns = [d[0] for d in (cursor.description or ())]
                rows: list[tuple] = []
                n_rows = 0
                truncated = False
                batch = max(1, settings.fetch_batch_rows)
                held_bytes, byte_cap = 0, settings.max_result_bytes
                # No value exceeds max_value_bytes (SQLITE_LIMIT_LENGTH), so a last batch of few cells keeps the
                # held bytes under the cap for sure and needs no estimate (the common case: counts, names, lists).
                row_bound = max(1, len(columns)) * settings.max_value_bytes
                while True:
                    chunk = cursor.fetchmany(batch)
                    if not chunk:
                        break
                    n_rows += len(chunk)
                    room = max_rows - len(rows)
                    if room > 0:
                        taken = chunk if room >= len(chunk) else chunk[:room]
                        # Bytes held, estimated from three rows per batch (exact accounting would cost
                        # as much as the fetch itself); past the cap rows are counted, not kept.
                        if len(chunk) < batch and held_bytes + len(taken) * row_bound <= byte_cap:
                            per_row = row_bound  # the last batch, and even its upper bound fits
                        else:
                            per_row = _sample_row_bytes(taken)
                        if held_bytes + per_row * len(taken) <= byte_cap:
                            rows.extend(taken)
                            held_bytes += per_row * len(taken)
                        else:
                            rows.extend(taken[: int((byte_cap - held_bytes) // per_row)])
                            max_rows = len(rows)
                    if n_rows > max_rows:
                        truncated = True
                        if not settings.count_rows_past_cap:
                            break
                    if len(chunk) < batch:
                        break  # a short batch is the last one: skip the empty fetch
                return QueryResult(columns, rows, n_rows, truncated and not settings.count_rows_past_cap,
                                   time.monotonic() - start)
            except sqlite3.OperationalError as err:
                if "could not decode" in str(err).lower() and db.conn.text_factory is str:
                    raise _DecodeError() from None
                if "interrupted" in str(err).lower():
                    if db.stopped_for_memory:
                        raise SandboxError(
                            f"Query stopped after {time.monotonic() - start:.1f} s to free memory: the sandbox's "
                            f"{settings.max_heap_bytes // 2**20} MiB are shared by all sessions and this query "
                            "had run longest while they were full. Sort or group fewer rows.") from None
                    raise SandboxError(f"Query timed out after {settings.timeout_s:g} s and was stopped.") from None
                raise SandboxError(self._sqlite_message(err)) from None
            except sqlite3.Warning as err:  # "You can only execute one statement at a time."
                raise SandboxError(f"SQL error: {err}") from None
            except sqlite3.Error as err:
                raise SandboxError(self._sqlite_message(err)) from None
            except MemoryError:  # SQLITE_NOMEM: handled by `_run` once this statement has given its memory back
                raise _OutOfMemory() from None
            except (ValueError, OverflowError, UnicodeError) as err:
                raise SandboxError(f"SQL error: {_clean_for_display(str(err), 160)}") from None
            finally:
                db.end_statement()
                if cursor is not None:
                    try:
                        cursor.close()
                    except Exception:
                        pass

    @staticmethod
    def _sqlite_message(err: Exception) -> str:
        msg = _clean_for_display(str(err), 300)
        if "not authorized" in msg or "prohibited" in msg.lower():
            return (f"Not allowed in the sandbox: {msg} (only reading tables; no PRAGMA, ATTACH, printf/format "
                    "or extension functions)")
        if "attempt to write" in msg or "readonly" in msg:
            return f"The database is read-only: {msg}"
        return f"SQL error: {msg}"
