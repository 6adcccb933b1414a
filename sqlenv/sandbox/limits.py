"""Limits and settings of the SQL sandbox: `SandboxSettings` (every number that bounds time, memory or text),
SQLite's own per-connection limits derived from them, and SQLite's process-wide heap (its hard limit and a gauge
of what it holds)."""

from __future__ import annotations

import ctypes
import sqlite3
from dataclasses import dataclass


@dataclass
class SandboxSettings:
    """Limits of the SQL sandbox. Every number that bounds time, memory or text is named here.

    Args:
        timeout_s: Wall-clock seconds one statement may run before it is interrupted (default 5.0).
            Checked by SQLite's progress handler, so runaway recursive CTEs and huge cross joins stop.
        progress_interval: SQLite virtual-machine instructions between two clock checks of the progress handler
            (default 4000), the second line behind the watchdog's interrupt at the deadline. Either stops a
            statement at its next jump; what runs until then is bounded by the limits below and by
            `max_uninterruptible_s`.
        max_display_rows: Result rows shown in a QUERY observation (default 20); the rest are counted as
            "(N more rows)".
        sample_rows: Rows shown by SAMPLE (default 5).
        max_scoring_rows: Most result rows held in memory for progress scoring and display (default 10_000).
            Rows past this are counted (while the time limit allows) but not kept.
        count_rows_past_cap: Keep counting rows beyond `max_scoring_rows` so "(N more rows)" is exact
            (default True). Counting holds no rows; the time limit still applies.
        fetch_batch_rows: Most rows fetched per `fetchmany` call (default 256); fewer where they could exceed
            `fetch_batch_bytes`.
        fetch_batch_bytes: Most bytes one `fetchmany` call may build in Python before they are counted (default
            16_000_000): a batch has at most as many rows as fit in it at their largest (each of the statement's
            columns a value of `max_value_bytes`), and at least one. A batch of 256 rows of 2,000 values of 10 KB
            was 4.4 GB before the byte cap saw any of it.
        max_observation_chars: Longest observation text (default 2000); longer text is cut with a marker.
        max_cell_chars: Longest single value shown in a result cell (default 80).
        max_sql_chars: Longest SQL text accepted (default 20_000); longer arguments get an error. It is also the
            QUERY argument's limit at the environment's door, so a longer one is never copied, parsed or cached.
        max_name_chars: Longest table name a DESCRIBE or SAMPLE argument may be (default 256; Spider's longest
            is 32 characters); a longer argument is refused at the environment's door, before any work.
        max_value_bytes: SQLite's SQLITE_LIMIT_LENGTH for the connection (default 10_000): no string, blob or
            row built or read by a query (e.g. `zeroblob`, `group_concat`) may exceed it. It bounds the cost of one
            function call, which runs inside one VM instruction out of the time check's reach: `instr` and
            `replace` are quadratic in it (1 MB strings took 3 s a call), `trim` with a character set too (its
            set holds at most 1/12 of it). Spider's longest value is 213 bytes.
        max_program_ops: SQLite's SQLITE_LIMIT_VDBE_OP (default 4_000): most instructions in one prepared
            statement, so a query cannot line up thousands of costly calls between two time checks (CTEs
            copied into every reference, long select lists). Spider's gold queries need at most 131.
        max_uninterruptible_s: Most seconds the function calls of one statement may take, at their worst, between
            two time checks (default 0.5). SQLite checks the time only at the jumps that close a loop; a statement
            whose program's calls, priced at their worst time per call under these limits (`sqlenv.sandbox.sql_costs`),
            add up to more is refused before it runs (one row of 800 `trim(x, y)` calls ran 19-22 s against 5 s).
            A statement that runs ends within `timeout_s` plus about this much on an idle core.
        max_columns: SQLite's SQLITE_LIMIT_COLUMN (default 128; SQLite's own default is 2,000): most columns in
            a result (a `*` counts each column it stands for), a GROUP BY or an ORDER BY. It bounds the widest row
            a fetch can build (`max_columns` values of `max_value_bytes`: ~5 MB) and the size of a prepared
            statement (a select list of 1,990 columns was ~1 MB). Spider's widest table has 48 columns and its
            gold queries return at most a few. A table wider than this can still be queried by its columns,
            but not by `SELECT *` (nor sampled).
        max_prepare_nodes: Most expression nodes SQLite may make when it prepares a statement by copying CTEs into
            their references and flattened subqueries' expressions into their columns' uses, as bounded from the
            text (default 100_000; `sqlenv.sandbox.prepare_cost`). SQLite checks no time limit while it prepares:
            470 characters of nested subqueries took ~1.5 s and the whole heap (8.5 s on a loaded server). Spider's
            8,034 gold queries are priced at most 197.
        max_expr_depth: SQLite's SQLITE_LIMIT_EXPR_DEPTH (default 100; Spider's gold SQL nests a few levels).
        max_compound_selects: SQLite's SQLITE_LIMIT_COMPOUND_SELECT (default 20): terms in one UNION/EXCEPT chain.
        max_function_args: SQLite's SQLITE_LIMIT_FUNCTION_ARG (default 32).
        max_heap_bytes: SQLite's hard heap limit (default 512 MiB), where temporary tables, sorts and CTE queues
            live (in SQLite's in-memory files: no temporary file on disk). A query that needs more fails with
            "out of memory"; the memory is given back at once. The limit is process-wide (SQLite has one heap,
            shared by every session) and can only be lowered: the smallest limit of any sandbox in the process
            holds. A statement that finds it full of other statements' memory gets room by stopping the one that
            has run longest.
        max_like_pattern_chars: SQLite's SQLITE_LIMIT_LIKE_PATTERN_LENGTH in bytes (default 100; Spider's longest
            pattern has 42), which bounds the cost of one LIKE/GLOB comparison: a pattern is tried at every
            position of a value, inside one VM instruction out of the time check's reach (a `GLOB '*[bbb...a]c'`
            of 500 bytes over 10 KB took ~10 ms of CPU a call).
        max_result_bytes: Most bytes of result rows held for scoring (default 32_000_000), measured on every row
            kept (Python's own size of the row and of each value); past it rows are counted but not kept, like
            past `max_scoring_rows`.
        max_kept_result_bytes: Most bytes of query results all the environments of the process keep between
            steps together (default 256_000_000): each keeps its episode's last result for execution accuracy, up
            to `max_result_bytes`, so 64 server sessions could keep ~2 GB. Past it the results kept longest are
            dropped (`sqlenv.kept_results`); such an episode's EX runs its query again when it ends.
        max_open_databases: Connections kept open per sandbox (default 64, least recently used closed). A
            reopened connection starts with cold caches, so keep this above the number of databases in use.
        statement_cache_size: Prepared statements Python's `sqlite3` keeps per connection (`cached_statements`,
            default 64): a repeated query skips SQLite's prepare step (~50 us of a ~110 us QUERY step on
            spider10's gold mix, `bench/serving/env_throughput.py`). They live on SQLite's shared heap, up to ~0.1 MB
            each (`max_columns`, `max_program_ops`), and an idle connection keeps them: when a statement or an opening
            needs that memory, idle connections are closed, least recently used first, whichever session owns
            them (`sqlenv.sandbox.heap_room`). 0 finalizes each statement when its cursor closes.
    """

    timeout_s: float = 5.0
    progress_interval: int = 4000
    max_display_rows: int = 20
    sample_rows: int = 5
    max_scoring_rows: int = 10_000
    count_rows_past_cap: bool = True
    fetch_batch_rows: int = 256
    fetch_batch_bytes: int = 16_000_000
    max_observation_chars: int = 2000
    max_cell_chars: int = 80
    max_sql_chars: int = 20_000
    max_name_chars: int = 256
    max_value_bytes: int = 10_000
    max_program_ops: int = 4_000
    max_uninterruptible_s: float = 0.5
    max_columns: int = 128
    max_prepare_nodes: int = 100_000
    max_expr_depth: int = 100
    max_compound_selects: int = 20
    max_function_args: int = 32
    max_heap_bytes: int = 512 * 1024 * 1024
    max_result_bytes: int = 32_000_000
    max_kept_result_bytes: int = 256_000_000
    max_like_pattern_chars: int = 100
    max_open_databases: int = 64
    statement_cache_size: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout_s", "max_uninterruptible_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxSettings.{name} must be > 0, got {getattr(self, name)}")
        for name in ("progress_interval", "max_display_rows", "sample_rows", "max_scoring_rows", "fetch_batch_rows",
                     "fetch_batch_bytes", "max_observation_chars", "max_cell_chars", "max_sql_chars", "max_name_chars",
                     "max_value_bytes", "max_result_bytes", "max_kept_result_bytes", "max_like_pattern_chars",
                     "max_open_databases", "max_program_ops", "max_columns", "max_prepare_nodes", "max_expr_depth",
                     "max_compound_selects", "max_function_args", "max_heap_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SandboxSettings.{name} must be >= 1, got {getattr(self, name)}")


def connection_limits(settings: SandboxSettings) -> dict[int, int]:
    """SQLite's own limits for a sandbox connection (`Connection.setlimit`), from the settings."""
    return {
        sqlite3.SQLITE_LIMIT_LENGTH: settings.max_value_bytes,
        sqlite3.SQLITE_LIMIT_SQL_LENGTH: 4 * settings.max_sql_chars + 64,  # UTF-8 bytes of the longest SQL text
        sqlite3.SQLITE_LIMIT_VDBE_OP: settings.max_program_ops,
        sqlite3.SQLITE_LIMIT_COLUMN: settings.max_columns,
        sqlite3.SQLITE_LIMIT_EXPR_DEPTH: settings.max_expr_depth,
        sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: settings.max_compound_selects,
        sqlite3.SQLITE_LIMIT_FUNCTION_ARG: settings.max_function_args,
        sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: settings.max_like_pattern_chars,
        sqlite3.SQLITE_LIMIT_ATTACHED: 0,  # the question's database is attached before this is set; no other can be
    }


def lower_heap_limit(conn: sqlite3.Connection, limit: int) -> None:
    """Set SQLite's process-wide hard heap limit to `limit` bytes unless a lower one is already set, and the soft
    limit to half of it: past the soft limit SQLite gives back page-cache memory before allocations fail."""
    current = conn.execute("PRAGMA hard_heap_limit").fetchone()[0]
    if current == 0 or current > limit:
        conn.execute(f"PRAGMA hard_heap_limit = {int(limit)}")
        conn.execute(f"PRAGMA soft_heap_limit = {int(limit) // 2}")


# Past this share of the hard heap limit, a statement short of memory is short because of others: one of them is
# stopped. Below it, the statement was too big by itself (or its program too long) and fails at once.
HEAP_FULL_SHARE = 0.75


class HeapGauge:
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
        """Whether at least `HEAP_FULL_SHARE` of the hard limit is in use (False where unreadable)."""
        usage = self.usage()
        return usage is not None and usage[0] >= usage[1] * HEAP_FULL_SHARE


HEAP = HeapGauge()
