"""The read-only SQL sandbox: `Sandbox`, where every QUERY, DESCRIBE and SAMPLE runs. SQL safety in SQLEnv lives
here and in the three modules it is built from:

- `sqlenv.sandbox.sql_checks`: what SQL may run (the text checks, the connection's authorizer, database paths);
- `sqlenv.sandbox.sql_costs`: what a statement may cost between two time checks (the price of every allowed function);
- `sqlenv.sandbox.limits`: limits and settings (`SandboxSettings`, SQLite's own limits, its shared heap);
- `sqlenv.sandbox.sql_runner`: execution (the connection, the time limit, the fetch under row and byte caps);

and `sqlenv.sandbox.result_text` writes the observation text. Model-written SQL is met by defence in depth
(Datasette-style named limits):

1. Text checks before SQLite sees anything, cheap enough for every step: length cap, no NUL bytes, valid
   UTF-8, and the first word (after comments) must be SELECT or WITH.
2. Exactly one statement: the `sqlite3` module refuses a statement followed by another one before running
   anything ("You can only execute one statement at a time").
3. The database file is attached through a `file:...?mode=ro` URI, with `PRAGMA query_only=1`.
4. An authorizer callback allows only reads, functions and recursive CTEs (no ATTACH, PRAGMA, writes).
5. A statement that runs past `timeout_s` is interrupted: a watchdog thread calls `Connection.interrupt()` at
   its deadline (SQLite stops at its next jump, even while this process's threads fight over the interpreter
   lock), and a progress handler checks the clock too.
6. What runs between two such checks (SQLite makes them only at the jumps that close a loop) is bounded:
   SQLite's own limits (`Connection.setlimit`: short values and LIKE patterns, small programs, shallow
   expressions, few compound SELECTs, no ATTACH), a price for every function the authorizer allows (its worst
   time per call under those limits, `sqlenv.sandbox.sql_costs`): a statement whose calls could add up past
   `max_uninterruptible_s` is refused before it runs; and sorts spill into runs of at most 2 MiB that are merged
   step by step, where one whole sort in memory was a single step of many seconds.
7. Temporary tables, sorts and CTE queues live in SQLite's in-memory files, under its process-wide hard heap
   limit: a query writes no temporary file, and one that needs too much memory fails alone. When a statement
   (or an opening) finds the heap already full of others' memory, idle connections are closed (what they keep:
   prepared statements, page caches), then the longest-running statement is stopped, and it runs once more
   within its own time limit: a small query is not failed by a big one next to it, nor by idle sessions.
8. Rows are fetched in batches no bigger than `fetch_batch_bytes` even at their widest (`max_columns` values of
   `max_value_bytes`), and at most `max_scoring_rows` rows and `max_result_bytes` bytes (measured on every
   row) are held; values and texts are cut.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from sqlenv.sandbox.result_text import TRUNCATION_MARKER, clean_for_display, cut_text, format_rows, format_value
from sqlenv.sandbox.limits import HEAP, SandboxSettings
from sqlenv.sandbox.sql_checks import (SandboxError, SQLCheck, check_sql, has_top_level_order_by, normalize_sql,
                               quick_check, resolve_database_path, table_name_too_long)
from sqlenv.sandbox.heap_room import make_room
from sqlenv.sandbox.sql_runner import Database, QueryResult, TableInfo, run_statement

# Names other modules (and tests) import from here: the sandbox's public surface, wherever each is defined.
_clean_for_display = clean_for_display  # the environment's import (older name)
_HEAP = HEAP
__all__ = ["Sandbox", "SandboxError", "SandboxSettings", "QueryResult", "TableInfo", "SQLCheck", "TRUNCATION_MARKER",
           "check_sql", "quick_check", "normalize_sql", "has_top_level_order_by", "resolve_database_path",
           "format_rows", "format_value", "cut_text", "clean_for_display"]

#: Pause before an opening short of memory tries again when no statement could be stopped for it.
OPEN_RETRY_S = 0.05


class Sandbox:
    """Read-only executor over the databases in `db_dir`. One instance per environment; thread-safe.

    Methods never let an SQLite or sqlglot exception escape except as `SandboxError` with a readable message.
    """

    def __init__(self, db_dir: str | Path, settings: SandboxSettings | None = None):
        self.db_dir = Path(db_dir)
        self.settings = settings or SandboxSettings()
        self._dbs: OrderedDict[str, Database] = OrderedDict()
        self._lock = threading.RLock()

    # -- connections
    def database(self, name: str) -> Database:
        with self._lock:
            db = self._dbs.get(name)
            if db is not None and not db.closed:
                self._dbs.move_to_end(name)
                return db
            self._dbs.pop(name, None)  # closed while idle, to give its memory to another session's statement
            path = resolve_database_path(self.db_dir, name)
            deadline = time.monotonic() + self.settings.timeout_s
            while True:
                try:
                    db = Database(path, self.settings, owner_lock=self._lock)
                    break
                except MemoryError:
                    # Opening needs little memory (the attach and the schema): the process-wide heap was full of
                    # other sessions' statements and idle connections. Unlike a statement, which may be too big
                    # by itself and so makes room once, an opening tries until its own time limit: closing idle
                    # connections, stopping the statement that has run longest, or waiting for the heap to move.
                    if not make_room(deadline):
                        time.sleep(OPEN_RETRY_S)
                    if time.monotonic() >= deadline:
                        raise SandboxError(f"Cannot open database {name!r} now: the sandbox is out of memory; "
                                           "try again.") from None
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
        if len(table) > self.settings.max_name_chars:  # no table has such a name: refused before any copy of it
            raise SandboxError(table_name_too_long(len(table), self.settings.max_name_chars))
        key = table.strip().strip(";").strip().strip('"`[]\'').strip().lower()
        for name, info in db.tables.items():
            if name.lower() == key:
                return info
        listing = ", ".join(db.tables) or "(none)"
        raise SandboxError(f"Unknown table {clean_for_display(table, 60)!r}. Tables: {listing}")

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
    def execute(self, db_name: str, sql: str, max_rows: int | None = None, *, settings: SandboxSettings | None = None,
                text_factory: Callable[[bytes], str] | None = None) -> QueryResult:
        """Run one checked, read-only statement; raises `SandboxError` with a message for the agent.

        Args:
            db_name: the database to run it on.
            sql: the statement.
            max_rows: rows to keep (default `settings.max_scoring_rows`).
            settings: limits for this statement only (default the sandbox's); e.g. whether to count rows past the
                cap. The connection itself keeps the limits it was opened with.
            text_factory: how TEXT values are decoded for this statement only (default: strict UTF-8, replacing
                invalid bytes on databases that hold them); execution accuracy decodes as the official code does.
        """
        if not isinstance(sql, str):
            raise SandboxError("SQL must be text.")
        settings = settings or self.settings
        limit = settings.max_sql_chars
        if not quick_check(sql, limit):
            raise SandboxError(check_sql(sql, limit).error
                               or "Only read-only SELECT (or WITH ... SELECT) queries are allowed.")
        cap = settings.max_scoring_rows if max_rows is None else max_rows
        try:
            with self._lock:  # no other thread may close this connection (LRU) between lookup and run
                db = self._dbs.get(db_name)
                if db is None or db.closed:
                    db = self.database(db_name)
                else:  # open: `database`'s own fast path, without its call and second lock
                    self._dbs.move_to_end(db_name)
                if text_factory is None:
                    return run_statement(db, sql, cap, settings)
                previous, db.conn.text_factory = db.conn.text_factory, text_factory
                try:
                    return run_statement(db, sql, cap, settings)
                finally:
                    db.conn.text_factory = previous
        except SandboxError as err:
            # SQLite refused or failed it: the full text check may name the reason better (a second
            # statement, a write keyword); otherwise SQLite's own message stands.
            reason = check_sql(sql, limit).error
            if reason:
                raise SandboxError(reason) from None
            raise err from None

    def _run(self, db: Database, sql: str, max_rows: int) -> QueryResult:
        with self._lock:
            return run_statement(db, sql, max_rows, self.settings)

    def render(self, result: QueryResult) -> str:
        """QUERY observation text for a result (≤ max_display_rows rows, cut to max_observation_chars)."""
        text = format_rows(result.columns, result.rows, result.n_rows, self.settings.max_display_rows,
                           self.settings.max_cell_chars, approximate=result.truncated)
        return cut_text(text, self.settings.max_observation_chars)
