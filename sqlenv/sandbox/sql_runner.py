"""Execution in the SQL sandbox: the read-only connection, the time limit, SQLite's shared heap, and the fetch
of a statement's rows under the row and byte caps.

- A connection's own main database is an empty one in SQLite's in-memory VFS (`memdb`), and the question's
  database file is attached read-only (`mode=ro`, and `immutable`: it never changes while it is read, so no lock
  or change check a statement) as `data` (unqualified names find its tables). Temporary
  storage goes through the main database's VFS, so with `temp_store = FILE` every temporary table and sort run
  is an in-memory file under SQLite's hard heap limit: nothing is written to disk, and a big sort spills into
  runs of at most `SORT_RUN_KIB` that are merged step by step. With temporary storage in memory
  (`temp_store = MEMORY`) SQLite instead sorts one whole list inside a single VM instruction, where neither the
  interrupt nor the progress handler reaches: 8 million random integers took 9 s past the end of their feed.
  Where the `memdb` VFS is missing (SQLite before 3.36), the file is the main database with `temp_store =
  MEMORY`, as before: sorts are then out of the time limit's reach.
- A statement that runs past `timeout_s` is interrupted: a watchdog thread (`sqlenv.sandbox.watchdog`) calls
  `Connection.interrupt()` at its deadline (SQLite stops at its next jump, even while this process's threads
  fight over the interpreter lock), and a progress handler checks the clock too.
- Those checks happen only at the jumps that close a loop: a statement whose function calls could together run
  longer than `max_uninterruptible_s` without one is refused before it runs (`sqlenv.sandbox.sql_costs`: its program is
  priced, the verdict kept per connection for short texts). None run while SQLite prepares a statement: one
  whose preparation could copy more than `max_prepare_nodes` expressions is refused from its text first
  (`sqlenv.sandbox.prepare_cost`).
- When a statement finds the heap already full of others' memory, idle connections (their prepared statements
  and caches) are closed, or the longest-running statement is stopped, and it runs once more within its own time
  limit (`sqlenv.sandbox.heap_room.make_room`).
- Rows are fetched in batches of at most `fetch_batch_bytes` at their largest (a row has at most `max_columns`
  values of at most `max_value_bytes`); at most `max_scoring_rows` rows and `max_result_bytes` bytes (measured
  on every row kept) are held.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlenv.sandbox.heap_room import OPEN_CONNECTIONS, make_room
from sqlenv.sandbox.prepare_cost import cached_expansion, expansion, may_copy, too_costly_to_prepare
from sqlenv.sandbox.result_text import clean_for_display
from sqlenv.sandbox.limits import SandboxSettings, connection_limits, lower_heap_limit
from sqlenv.sandbox.sql_checks import (DATA_SCHEMA, SCHEMA_TABLE_REFUSAL, SandboxError, authorizer, cacheable_text,
                               function_allowed, function_refusal, is_schema_read, refusal_message)
from sqlenv.sandbox.sql_costs import costly_names, names_costly_function, program_price, too_costly
from sqlenv.sandbox.watchdog import WATCHDOG


@dataclass(slots=True)
class QueryResult:
    """A statement's result: column names, the kept rows (≤ max_scoring_rows) and the total row count."""

    columns: list[str]
    rows: list[tuple]
    n_rows: int
    truncated: bool = False  # rows were dropped past max_scoring_rows (n_rows may be a lower bound)
    elapsed_s: float = 0.0
    # What holding `rows` costs (`rows_bytes`), at most: measured, except for the rows from `unmeasured_from` on (a
    # last batch whose bound fit under the byte cap), counted at that bound until `held_bytes()` measures them.
    nbytes: int = 0
    unmeasured_from: int = 0
    value_bytes: int = 0  # the longest value the statement could hold (`max_value_bytes`), for that bound

    def held_bytes(self) -> int:
        """What holding `rows` costs, measured (once: `nbytes` is exact afterwards)."""
        if self.unmeasured_from < len(self.rows):
            tail = self.rows[self.unmeasured_from:]
            bound = len(tail) * _row_bound(len(self.columns), self.value_bytes)
            self.nbytes += rows_bytes(tail) - bound
            self.unmeasured_from = len(self.rows)
        return self.nbytes


@dataclass
class TableInfo:
    """Schema of one table: `columns` as (name, type, is_pk) and `foreign_keys` as col -> 'table.col'."""

    name: str
    columns: list[tuple[str, str, bool]]
    foreign_keys: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------- the connection

#: Largest sort run SQLite holds before writing it (sorted) to a temporary in-memory file: the main database's
#: `cache_size` sets it (SQLite's default, made explicit). Sorting one run is the longest step a sort takes
#: between two interrupt checks (~2 MiB: tens of milliseconds); the runs are then merged step by step.
SORT_RUN_KIB = 2048

_FILE_VFS = "win32" if os.name == "nt" else "unix"  # the default VFS, for the attached database file
_memdb_available: bool | None = None


def _memdb_vfs() -> bool:
    """Whether this SQLite has the in-memory `memdb` VFS (3.36+, unless compiled without it)."""
    global _memdb_available
    if _memdb_available is None:
        try:
            sqlite3.connect("file:sqlenv-probe?vfs=memdb", uri=True).close()
            _memdb_available = True
        except sqlite3.Error:
            _memdb_available = False
    return _memdb_available


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class Database:
    """One read-only connection to a question's database plus its schema, owned by one `Sandbox`.

    With `owner_lock` (the lock its owner holds while it uses the connection) the connection may be closed by
    another sandbox's statement that needs the memory it holds while idle (`sqlenv.sandbox.heap_room`); its owner
    then sees `closed` and opens it again."""

    def __init__(self, path: Path, settings: SandboxSettings, owner_lock: Any = None):
        self.path = path
        self.settings = settings
        stat = path.stat()
        # The file this connection reads, as of opening (a file replaced later is a new identity once reopened):
        # keys caches of results derived from it, without a stat per use.
        self.identity = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
        # Read-only, and immutable: a question's database is written once, when its dataset is prepared (a new file
        # swapped into place), never while it is read, so SQLite need not lock the file or look for a hot journal
        # and a change at each statement (~7 us of system calls a QUERY, an eighth of a Spider gold query's run).
        file_uri = path.as_uri() + "?mode=ro&immutable=1"
        in_memory_main = _memdb_vfs()
        uri = "file:sqlenv-sandbox?vfs=memdb" if in_memory_main else file_uri  # a private, empty main database
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                               cached_statements=max(0, settings.statement_cache_size))
        try:
            if in_memory_main:
                # The file, read-only through the ordinary VFS (ATTACH would default to the main database's).
                conn.execute(f"ATTACH DATABASE ? AS {DATA_SCHEMA}", (f"{file_uri}&vfs={_FILE_VFS}",))
                conn.execute("PRAGMA temp_store = FILE")  # temporary files, in memory (memdb): see the module doc
                conn.execute(f"PRAGMA main.cache_size = -{SORT_RUN_KIB}")
                self.schema = DATA_SCHEMA
            else:
                conn.execute("PRAGMA temp_store = MEMORY")  # never a temporary file on disk, but sorts unbounded
                self.schema = "main"
            conn.execute("PRAGMA query_only = 1")
            lower_heap_limit(conn, settings.max_heap_bytes)
            self.tables: dict[str, TableInfo] = self._read_schema(conn, self.schema)
            # A view or a generated column is code that a statement runs without naming its functions.
            self.costly_names = costly_names(settings)
            schema_sql = " ".join(sql for (sql,) in conn.execute(
                f"SELECT sql FROM {self.schema}.sqlite_master WHERE sql IS NOT NULL"))
            self.schema_calls_costly = names_costly_function(schema_sql, self.costly_names)
            for limit, value in connection_limits(settings).items():
                conn.setlimit(limit, value)
            conn.set_authorizer(self._authorize)
        except Exception:
            conn.close()
            raise
        self.conn = conn
        self.deadline = float("inf")
        self.deadline_lock = threading.Lock()  # the watchdog interrupts only the statement whose deadline passed
        self.stopped_for_memory = False  # the running statement was interrupted to free memory, not at its deadline
        self.read_schema_table = False  # the statement being prepared was refused a schema table (for the message)
        self.refused_function: str | None = None  # ... or a function (for the message)
        conn.set_progress_handler(self._on_progress, max(1, settings.progress_interval))
        self.row_counts: dict[str, int] = {}
        self.idle_cursor: sqlite3.Cursor | None = None  # the last statement's, read to its end (`_run_once`)
        self._prices: OrderedDict[str, tuple[float, dict[str, int]]] = OrderedDict()
        self.last_used = time.monotonic()
        self.closed = False
        self.owner_lock = owner_lock
        if owner_lock is not None:
            OPEN_CONNECTIONS.add(self)

    def _authorize(self, action: int, arg1: Any, arg2: Any, db_name: Any, source: Any) -> int:
        verdict = authorizer(action, arg1, arg2, db_name, source)
        if verdict == sqlite3.SQLITE_DENY:
            if is_schema_read(action, arg1, db_name):
                self.read_schema_table = True
            elif action == sqlite3.SQLITE_FUNCTION and not function_allowed(arg2):
                self.refused_function = str(arg2)
        return verdict

    #: Verdicts of the pricing kept per connection (texts of at most `CACHED_SQL_CHARS` only).
    PRICE_CACHE_SIZE = 256

    def check_cost(self, sql: str) -> None:
        """Refuse `sql` (`SandboxError`) when preparing it could copy more than `max_prepare_nodes` expressions
        (`sqlenv.sandbox.prepare_cost`, from the text: SQLite checks no time while it prepares), or when its function
        calls could run longer than `max_uninterruptible_s` without a time check (`sqlenv.sandbox.sql_costs`).
        Only the texts that could copy past the bound are priced for their preparation (`may_copy`), and only those
        that name a costly function for their calls."""
        limit = self.settings.max_prepare_nodes
        if may_copy(sql.lower(), limit):
            nodes = cached_expansion(sql, limit) if cacheable_text(sql) else expansion(sql, limit)
            if nodes > limit:
                raise SandboxError(too_costly_to_prepare(nodes, limit))
        if not (self.schema_calls_costly or names_costly_function(sql, self.costly_names)):
            return
        verdict = self._prices.get(sql)
        if verdict is None:
            verdict = program_price(self.conn, sql, self.settings)
            if cacheable_text(sql):
                self._prices[sql] = verdict
                while len(self._prices) > self.PRICE_CACHE_SIZE:
                    self._prices.popitem(last=False)
        else:
            self._prices.move_to_end(sql)
        total, counts = verdict
        if total > self.settings.max_uninterruptible_s:
            raise SandboxError(too_costly(total, counts, self.settings))

    def _on_progress(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0  # non-zero interrupts the statement

    def start_statement(self, deadline: float) -> float:
        """Arm the time limit of the statement about to run (a `time.monotonic()` deadline); returns its start."""
        with self.deadline_lock:
            self.deadline = deadline
            self.stopped_for_memory = False
        self.read_schema_table = False
        self.refused_function = None
        WATCHDOG.watch(self, deadline)
        self.last_used = time.monotonic()
        return self.last_used

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
    def _read_schema(conn: sqlite3.Connection, schema: str) -> dict[str, TableInfo]:
        # Schema introspection runs before the authorizer is installed (it needs PRAGMAs).
        names = [r[0] for r in conn.execute(
            f"SELECT name FROM {schema}.sqlite_master WHERE type IN ('table','view') AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid")]
        tables = {}
        for name in names:
            quoted = '"' + name.replace('"', '""') + '"'
            cols = [(r[1], (r[2] or "").upper(), bool(r[5]))
                    for r in conn.execute(f"PRAGMA {schema}.table_info({quoted})")]
            fks = {}
            for r in conn.execute(f"PRAGMA {schema}.foreign_key_list({quoted})"):
                fks[r[3]] = f"{r[2]}.{r[4]}" if r[4] else str(r[2])
            tables[name] = TableInfo(name, cols, fks)
        return tables

    def close(self) -> None:
        """Close the connection (its prepared statements and caches go back to SQLite's heap)."""
        self.closed = True
        OPEN_CONNECTIONS.remove(self)
        try:
            self.conn.close()
        except Exception:
            pass


# ------------------------------------------------------------------------------------- result size, measured

_getsizeof = sys.getsizeof
_NUMBER_TYPES = {int, float, type(None)}
_NUMBER_BYTES = 36  # sys.getsizeof of the largest 64-bit int; floats (24) and None (16) take less
_ASCII_TEXT_BYTES = _getsizeof("")  # a str of n ASCII characters takes this + n bytes


def _column_bytes(column: tuple) -> int:
    """Python's own size of one column of a batch, in C-level passes: text lengths summed (ASCII text, the common
    case), numbers and NULL at a fixed size, anything else (non-ASCII text, blobs, mixed columns) measured value by
    value with `sys.getsizeof`. Never less than what the values hold."""
    try:
        chars = sum(map(len, column))  # TypeError on a number or NULL
    except TypeError:
        if set(map(type, column)) <= _NUMBER_TYPES:
            return _NUMBER_BYTES * len(column)
        return sum(map(_getsizeof, column))
    try:
        if all(map(str.isascii, column)):  # TypeError on a blob
            return chars + _ASCII_TEXT_BYTES * len(column)
    except TypeError:
        pass
    return sum(map(_getsizeof, column))


def rows_bytes(rows: list[tuple]) -> int:
    """Bytes that holding `rows` costs: each row tuple (with its slot in the result list) and every value in it.
    Every row is measured, so no arrangement of big and small rows is under-counted."""
    if not rows:
        return 0
    per_row = _getsizeof(rows[0]) + 8
    return per_row * len(rows) + sum(map(_column_bytes, zip(*rows)))


@functools.lru_cache(maxsize=1024)  # a few column counts (at most `max_columns`) and limits: once each
def _row_bound(n_columns: int, max_value_bytes: int) -> int:
    """The most a row can take in Python: its tuple (and slot in the result list), and each value at most a text of
    `max_value_bytes` UTF-8 bytes, at most 4 bytes a byte (a 4-byte-wide str, or lenient decoding's 2-byte
    replacement characters), plus the object's header."""
    return _getsizeof((None,) * n_columns) + 8 + n_columns * (4 * max_value_bytes + 80)


# ------------------------------------------------------------------------------------------ running a statement

class _DecodeError(Exception):
    pass


class _OutOfMemory(Exception):
    pass


def _refusal(db: Database, err: Exception) -> str:
    """The agent's message for an error SQLite raised, naming what the authorizer refused when it refused."""
    if db.read_schema_table:
        return SCHEMA_TABLE_REFUSAL
    if db.refused_function is not None:
        return function_refusal(db.refused_function)
    return refusal_message(err)


def run_statement(db: Database, sql: str, max_rows: int, settings: SandboxSettings) -> QueryResult:
    """Run one statement on `db` within `settings.timeout_s` and fetch at most `max_rows` rows (and at most
    `max_result_bytes`); raises `SandboxError` with a message for the agent."""
    deadline = time.monotonic() + settings.timeout_s  # one time limit for the statement, however often it runs
    made_room = False
    while True:
        try:
            return _run_once(db, sql, max_rows, deadline, settings)
        except _DecodeError:
            # Some real databases hold invalid UTF-8 text: switch this connection to lenient decoding
            # (slower, so only where needed) and run again.
            db.conn.text_factory = _lenient_text
        except _OutOfMemory:  # SQLITE_NOMEM: the heap limit, or a program past max_program_ops
            if made_room or not make_room(deadline, keep=db):
                raise SandboxError(
                    f"Query too large or needs too much memory (limits: {settings.max_program_ops} SQLite "
                    f"instructions, {settings.max_heap_bytes // 2**20} MiB shared by all sessions); simplify "
                    "it.") from None
            made_room = True


def _run_once(db: Database, sql: str, max_rows: int, deadline: float, settings: SandboxSettings) -> QueryResult:
    start = db.start_statement(deadline)
    cursor, done = None, False
    try:
        db.check_cost(sql)
        # A statement read to its end leaves its cursor for the next one (SQLite reset it); any other is closed.
        cursor, db.idle_cursor = db.idle_cursor or db.conn.cursor(), None
        cursor.execute(sql)
        columns = list(map(itemgetter(0), cursor.description or ()))
        rows: list[tuple] = []
        n_rows = 0
        truncated = False
        held_bytes, byte_cap = 0, settings.max_result_bytes
        # An upper bound of one row's size: a short last batch whose bound fits needs no measuring (the common
        # case: counts, names, short lists). A batch is built whole before any of it is measured: so many rows
        # that even at their largest they fit in `fetch_batch_bytes`.
        row_bound = _row_bound(len(columns), settings.max_value_bytes)
        batch = max(1, min(settings.fetch_batch_rows, settings.fetch_batch_bytes // row_bound))
        measured = None  # where unmeasured rows start (none so far)
        while True:
            chunk = cursor.fetchmany(batch)
            if not chunk:
                done = True
                break
            n_rows += len(chunk)
            room = max_rows - len(rows)
            if room > 0:
                taken = chunk if room >= len(chunk) else chunk[:room]
                if len(chunk) < batch and held_bytes + len(taken) * row_bound <= byte_cap:
                    measured = len(rows)  # the last batch, and even its bound fits: not measured (at its bound)
                    rows.extend(taken)
                    held_bytes += len(taken) * row_bound
                else:
                    size = rows_bytes(taken)
                    if held_bytes + size <= byte_cap:
                        rows.extend(taken)
                        held_bytes += size
                    else:  # past the cap rows are counted, not kept: keep the batch's rows that still fit
                        for row in taken:
                            size = rows_bytes([row])
                            if held_bytes + size > byte_cap:
                                break
                            rows.append(row)
                            held_bytes += size
                        max_rows = len(rows)
            if n_rows > max_rows:
                truncated = True
                if not settings.count_rows_past_cap:
                    break
            if len(chunk) < batch:
                done = True
                break  # a short batch is the last one: skip the empty fetch
            chunk = taken = None  # dropped before the next batch is built, not after: one batch at a time
        return QueryResult(columns, rows, n_rows, truncated and not settings.count_rows_past_cap,
                           time.monotonic() - start, held_bytes, len(rows) if measured is None else measured,
                           settings.max_value_bytes)
    except sqlite3.OperationalError as err:
        message = str(err).lower()
        if "could not decode" in message and db.conn.text_factory is str:
            raise _DecodeError() from None
        if "interrupted" in message:
            if db.stopped_for_memory:
                raise SandboxError(
                    f"Query stopped after {time.monotonic() - start:.1f} s to free memory: the sandbox's "
                    f"{settings.max_heap_bytes // 2**20} MiB are shared by all sessions and this query "
                    "had run longest while they were full. Sort or group fewer rows.") from None
            raise SandboxError(f"Query timed out after {settings.timeout_s:g} s and was stopped.") from None
        if db.schema == DATA_SCHEMA and ("disk i/o error" in message or "disk is full" in message):
            raise _OutOfMemory() from None  # the only files written are in-memory ones: their growth failed
        raise SandboxError(_refusal(db, err)) from None
    except sqlite3.Warning as err:  # "You can only execute one statement at a time."
        raise SandboxError(f"SQL error: {err}") from None
    except sqlite3.Error as err:
        raise SandboxError(_refusal(db, err)) from None
    except MemoryError:  # SQLITE_NOMEM: handled by `run_statement` once this statement has given its memory back
        raise _OutOfMemory() from None
    except (ValueError, OverflowError, UnicodeError) as err:
        raise SandboxError(f"SQL error: {clean_for_display(str(err), 160)}") from None
    finally:
        db.end_statement()
        if done:
            db.idle_cursor = cursor
        elif cursor is not None:
            try:
                cursor.close()
            except Exception:
                pass
