"""What SQL may run in the sandbox: the text checks, the connection's authorizer and the database paths.

Model-written SQL first meets the per-step text check (`quick_check`: not empty or too long, no NUL byte, valid
UTF-8, first word SELECT or WITH). SQLite enforces the rest (one statement, read-only connection, the
`authorizer` below). When either refuses, the full text check (`check_sql`, on sqlglot's tokens) names the reason
in words the agent can act on ("Only one SQL statement is allowed per QUERY", "... DELETE is not"). Repeated
queries are spotted on a cheap normal form (`normalize_sql`, one regular expression), not on a parse.

The per-text caches hold only short texts (`CACHED_SQL_CHARS`): a hostile argument of many megabytes, refused as
too long, is never kept as a key, so what the caches hold stays bounded for the life of the process.

Database names come from question files, so they are validated and resolved to stay inside `db_dir`.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from sqlenv.sandbox.result_text import clean_for_display
from sqlenv.sandbox.sql_costs import ALLOWED_FUNCTIONS


class SandboxError(Exception):
    """A query the sandbox refuses or that failed; its message is shown to the agent."""


# ----------------------------------------------------------------------------------------- SQL text checks

#: Longest SQL text the per-text caches keep (Spider's longest gold query has 577 characters). Longer texts are
#: checked or normalised again each time (linear work, at most `max_sql_chars`), never stored: the caches hold
#: at most 8,192 normal forms and 1,024 verdicts of texts this long (~30 MB at worst, whoever sends them).
CACHED_SQL_CHARS = 1_000


def cacheable_text(sql: str) -> bool:
    """Whether `sql` is short enough to be a cache key: at most `CACHED_SQL_CHARS` characters, and as many bytes
    (a str of wider characters takes 2 or 4 bytes each)."""
    n = len(sql)
    return n <= CACHED_SQL_CHARS and (n <= CACHED_SQL_CHARS // 4 or sql.isascii())


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


def sql_too_long(length: int, max_sql_chars: int) -> str:
    """The refusal of an SQL text of `length` characters (the environment's door says it the same way)."""
    return f"SQL too long ({length} characters, limit {max_sql_chars}): send one shorter SELECT statement."


def table_name_too_long(length: int, max_name_chars: int) -> str:
    """The refusal of a DESCRIBE/SAMPLE argument of `length` characters."""
    return (f"Table name too long ({length} characters, limit {max_name_chars}): give one table name from the "
            "observation's table list.")


def _text_refusal(sql: str, max_sql_chars: int) -> str | None:
    """Why `sql` cannot even be looked at (empty, too long, a NUL byte, not UTF-8), or None. O(len) in C."""
    if not sql or sql.isspace():
        return "Empty SQL: give one SELECT statement."
    if len(sql) > max_sql_chars:
        return sql_too_long(len(sql), max_sql_chars)
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


@dataclass(frozen=True)
class SQLCheck:
    """The verdict of the full text check on one SQL string (`error` is None when it passes)."""

    error: str | None


def check_sql(sql: str, max_sql_chars: int = 20_000) -> SQLCheck:
    """The full text check: is `sql` exactly one read-only SELECT / WITH ... SELECT statement?

    The text is split into statements on sqlglot's tokens (so semicolons inside strings and comments don't
    count), the statement must start with SELECT or WITH and contain no write/PRAGMA/ATTACH keyword, and
    `sqlite3.complete_statement` must agree it is complete. It runs when `quick_check` or SQLite refused a
    query, to name the reason; the connection's authorizer and read-only mode enforce the rules either way.
    Verdicts on texts of at most `CACHED_SQL_CHARS` are cached; a text refused for its length never is.
    """
    refusal = _text_refusal(sql, max_sql_chars)
    if refusal:
        return SQLCheck(refusal)
    if cacheable_text(sql):
        return _check_sql_cached(sql)
    return _check_sql(sql)


@functools.lru_cache(maxsize=1024)
def _check_sql_cached(sql: str) -> SQLCheck:
    return _check_sql(sql)


def _check_sql(sql: str) -> SQLCheck:
    try:
        tokens = sqlglot.tokenize(sql, read="sqlite")
    except Exception as err:  # sqlglot raises TokenError on unterminated strings etc.
        return SQLCheck(f"SQL syntax error: {clean_for_display(str(err), 160)}")
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


check_sql.cache_clear = _check_sql_cached.cache_clear  # type: ignore[attr-defined]
check_sql.cache_info = _check_sql_cached.cache_info  # type: ignore[attr-defined]


# The parts of a query kept as written in its normal form: quoted strings and names ('Bob' and 'bob' differ,
# and SQLite reads an unknown "x" as a string), and comments (dropped). Every alternative is linear.
_QUOTED_OR_COMMENT = re.compile(r"""('(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?"""
                                r"""|--[^\n]*|/\*(?:[^*]|\*(?!/))*(?:\*/)?)""")
# Tokens of the rest: a run of word characters or one other character.
_WORD_OR_CHAR = re.compile(r"[\w$]+|\S")


def normalize_sql(sql: str, max_sql_chars: int = 20_000) -> str:
    """The normal form of `sql`, used to spot repeated queries: one space between tokens, comments and
    trailing semicolons gone, keywords and bare names lower-case (SQLite's are case-insensitive), quoted
    strings and names as written. A few microseconds (regular expressions, no parse); at most `max_sql_chars`
    characters are read, and only texts of at most `CACHED_SQL_CHARS` are cached."""
    if cacheable_text(sql):
        return _normalize_cached(sql, max_sql_chars)
    return _normalize(sql, max_sql_chars)


@functools.lru_cache(maxsize=8192)
def _normalize_cached(sql: str, max_sql_chars: int) -> str:
    return _normalize(sql, max_sql_chars)


def _normalize(sql: str, max_sql_chars: int) -> str:
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


normalize_sql.cache_clear = _normalize_cached.cache_clear  # type: ignore[attr-defined]
normalize_sql.cache_info = _normalize_cached.cache_info  # type: ignore[attr-defined]


def squeezed(text: str) -> str:
    """`text` lower-cased, its whitespace and trailing semicolons gone: equal for two texts of one normal form
    (`normalize_sql`), so two texts whose squeezed forms differ are no repeat of each other."""
    return "".join(text.lower().split()).rstrip(";")


# The ASCII characters `str.split()` splits on: an ASCII text squeezed as bytes, in C passes (~0.3 us, not ~1 us).
_ASCII_SPACE = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"


class SeenQueries:
    """The QUERY texts of one episode, to tell a repeat (a text whose normal form, `normalize_sql`, was seen
    before) without computing every text's normal form, which costs ~5 us a new text.

    Two texts of one normal form have one `squeezed` form (the normal form's own, whitespace and semicolons aside),
    and a text of ASCII characters without comments squeezes as its normal form does (lower-casing ASCII needs no
    context, and the normal form only moves whitespace, drops trailing semicolons and comments): so such a text is
    squeezed directly, any other one through its normal form, and a text whose squeezed form is new is no repeat.
    Normal forms are computed only for texts that squeeze alike. Texts are kept as given (the environment's door
    bounds them by `max_sql_chars`), at most `max_sql_chars` + 1 characters of them read."""

    def __init__(self, max_sql_chars: int = 20_000):
        self.max_sql_chars = max_sql_chars
        self._texts: dict[bytes, list[str]] = {}  # squeezed form (UTF-8) -> the texts seen with it

    def add(self, sql: str) -> bool:
        """Record the QUERY text `sql`; whether its normal form was seen before in this episode."""
        limit = self.max_sql_chars
        if len(sql) > limit:
            sql = sql[: limit + 1]
        if sql.isascii() and "--" not in sql and "/*" not in sql:  # `squeezed(sql)`, as UTF-8 bytes
            key = sql.encode("ascii").translate(None, _ASCII_SPACE).lower().rstrip(b";")
        else:
            key = squeezed(normalize_sql(sql, limit)).encode("utf-8", "surrogatepass")
        earlier = self._texts.get(key)
        if earlier is None:  # the common case: no text squeezed alike, no normal form needed
            self._texts[key] = [sql]
            return False
        form = normalize_sql(sql, limit)
        repeat = any(normalize_sql(text, limit) == form for text in earlier)
        earlier.append(sql)
        return repeat


@functools.lru_cache(maxsize=4096)
def has_top_level_order_by(sql: str) -> bool:
    """Whether a query's result order is meaningful: its sqlglot parse has a top-level ORDER BY. (Called on
    gold SQL, which comes from the dataset, never on the agent's text.)"""
    if not sql:
        return False
    try:
        trees = [t for t in sqlglot.parse(sql, read="sqlite") if t is not None and not isinstance(t, exp.Semicolon)]
    except (SqlglotError, RecursionError, ValueError):
        return False
    return len(trees) == 1 and bool(trees[0].args.get("order"))


# ----------------------------------------------------------------------------------------- the authorizer

#: The schema name under which a sandbox connection attaches the question's database (`sqlenv.sandbox.sql_runner`:
#: the connection's own main database is an empty one in memory, which keeps temporary storage off the disk).
DATA_SCHEMA = "data"

# What a user query may do: read, call functions, recurse. Nothing else (no PRAGMA functions).
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                    getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
# Functions run only when `sqlenv.sandbox.sql_costs` prices them (`ALLOWED_FUNCTIONS`): their worst time per call is
# measured. Never priced, so never run: printf/format (one call with a huge width, printf('%.900000000c', 'x'), runs
# for many seconds inside a single VM instruction), extension loading and files, full-text and R-tree internals.
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "printf", "format"}
# The schema tables of the connection's own (empty) main and temp databases: reading them would list no tables,
# which misleads more than a refusal that points to DESCRIBE.
_SCHEMA_TABLES = {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"}


def authorizer(action: int, arg1: Any, arg2: Any, db_name: Any, source: Any) -> int:
    """The sandbox connection's authorizer (`Connection.set_authorizer`): reads, functions and recursive CTEs
    only; of the functions, only those with a price (`sqlenv.sandbox.sql_costs.ALLOWED_FUNCTIONS`); not the schema
    tables of the empty main database."""
    if action in _ALLOWED_ACTIONS:
        if action == sqlite3.SQLITE_FUNCTION and not function_allowed(arg2):
            return sqlite3.SQLITE_DENY
        if is_schema_read(action, arg1, db_name):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def function_allowed(name: Any) -> bool:
    """Whether the authorizer lets a statement call the function `name` (SQLite matches names in any ASCII case)."""
    return isinstance(name, str) and name.lower() in ALLOWED_FUNCTIONS and name.lower() not in _DENIED_FUNCTIONS


def function_refusal(name: str) -> str:
    """The agent's message for a call of a function the sandbox does not allow."""
    return (f"Not allowed in the sandbox: the function {clean_for_display(name, 40)}() is not available (reading "
            "tables and SQLite's core, date, math and JSON functions only; no printf/format or extension "
            "functions).")


def is_schema_read(action: int, table: Any, db_name: Any) -> bool:
    """Whether an authorizer call reads the schema table of the connection's own (empty) main or temp database."""
    return action == sqlite3.SQLITE_READ and db_name != DATA_SCHEMA and isinstance(table, str) \
        and table.lower() in _SCHEMA_TABLES


SCHEMA_TABLE_REFUSAL = ("Not allowed in the sandbox: the schema table cannot be queried here; DESCRIBE a table to "
                        "see its columns (the observation lists the tables).")


def refusal_message(err: Exception) -> str:
    """The agent's message for an error SQLite raised while preparing or running a statement."""
    msg = clean_for_display(str(err), 300)
    if "not authorized" in msg or "prohibited" in msg.lower():
        return (f"Not allowed in the sandbox: {msg} (only reading tables; no PRAGMA, ATTACH, printf/format "
                "or extension functions)")
    if "attempt to write" in msg or "readonly" in msg:
        return f"The database is read-only: {msg}"
    return f"SQL error: {msg}"


# ------------------------------------------------------------------------------------------- path checks

_DB_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def resolve_database_path(db_dir: str | Path, name: str) -> Path:
    """The SQLite file of database `name` inside `db_dir` (`<db_dir>/<name>/<name>.sqlite`, or a flat
    `<db_dir>/<name>.sqlite`). Names with path separators, '..' or odd characters are refused, and the
    resolved path must stay inside `db_dir` (symlinks included)."""
    if not isinstance(name, str) or not _DB_NAME_RE.match(name) or ".." in name:
        raise SandboxError(f"Invalid database name {clean_for_display(str(name), 60)!r}.")
    root = Path(db_dir).resolve()
    for candidate in (root / name / f"{name}.sqlite", root / f"{name}.sqlite"):
        resolved = candidate.resolve()
        if not resolved.is_relative_to(root):
            raise SandboxError(f"Database {name!r} resolves outside the database folder.")
        if resolved.is_file():
            return resolved
    raise SandboxError(f"Database {name!r} not found in {root}.")
