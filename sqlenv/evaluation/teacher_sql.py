"""The SQL a warm-start teacher writes: the gold query in one spelling, the value filters worth a SAMPLE, and the
broken queries whose error a careful analyst reads and fixes.

A small model imitating the teacher learns the spelling it is shown. Spider's gold SQL comes in many: `count(*)` and
`COUNT(*)`, `a ,  b`, `"English"` and `'English'`, keywords in either case. `tidy_sql` writes every query one way
(keywords and function names upper-case, one space between tokens, `, ` between items, strings in single quotes),
changing nothing inside a quoted string. The oracle checks that the tidied query returns what the gold one does and
falls back to the gold text when it does not (`sqlenv.evaluation.policies.OraclePolicy`).

`filtered_tables` names the tables whose values a query compares with a string (`WHERE T1.name = 'Rock'`): looking at
a few rows first shows how the data spells such values. `broken_queries` gives the query with a column taken from the
wrong place (`T2.name` where `name` is `T1`'s, or a column of a table the query does not read), which SQLite refuses
with `no such column`: the mistake a small model makes most, and one the error message says how to fix.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import sqlglot
from sqlglot import exp

__all__ = ["tidy_sql", "filtered_tables", "broken_queries"]

#: Words written upper-case by `tidy_sql` where they stand as words outside quotes.
_KEYWORDS = (
    "select", "distinct", "from", "where", "group", "by", "order", "having", "limit", "offset", "join", "inner",
    "left", "right", "outer", "cross", "on", "as", "and", "or", "not", "in", "like", "between", "is", "null", "exists",
    "union", "intersect", "except", "all", "asc", "desc", "case", "when", "then", "else", "end", "with",
)
_FUNCTIONS = ("count", "sum", "avg", "min", "max", "abs", "round", "length", "lower", "upper", "cast")
_KEYWORD = re.compile(r"(?<![\w.])(" + "|".join(_KEYWORDS) + r")(?![\w.])", re.IGNORECASE)
_FUNCTION = re.compile(r"(?<![\w.])(" + "|".join(_FUNCTIONS) + r")\s*\(", re.IGNORECASE)
# A quoted piece: a string in single quotes, a double-quoted name or string, a backquoted or bracketed name.
_QUOTED = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\])""")


def tidy_sql(sql: str) -> str:
    """`sql` in one spelling: keywords and aggregate names upper-case, single spaces, `, ` between items, no space
    inside parentheses, a double-quoted string in single quotes (when it holds no single quote), no trailing `;`.
    Quoted text is kept as it is. The caller checks the result is the same (a double-quoted text is a name in SQLite
    when a column has that name)."""
    pieces = _QUOTED.split(sql.strip().rstrip(";").strip())
    out = []
    for index, piece in enumerate(pieces):
        if index % 2:  # quoted
            if piece.startswith('"') and "'" not in piece:
                piece = "'" + piece[1:-1].replace('""', '"') + "'"
            out.append(piece)
            continue
        piece = re.sub(r"\s+", " ", piece)
        piece = re.sub(r"\s*,\s*", ", ", piece)
        piece = re.sub(r"\(\s+", "(", piece)
        piece = re.sub(r"\s+\)", ")", piece)
        piece = _KEYWORD.sub(lambda m: m.group(1).upper(), piece)
        piece = _FUNCTION.sub(lambda m: m.group(1).upper() + "(", piece)
        out.append(piece)
    return "".join(out).strip()


def _parse(sql: str) -> exp.Expression | None:
    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.SqlglotError, RecursionError):
        return None


def _aliases(tree: exp.Expression) -> dict[str, str]:
    """Alias (and bare table name), lower-case -> table name, for every table the query reads."""
    names: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        names[table.name.lower()] = table.name
        if table.alias:
            names[table.alias.lower()] = table.name
    return names


def _table_of(column: exp.Column, aliases: dict[str, str]) -> str | None:
    if column.table:
        return aliases.get(column.table.lower())
    tables = set(aliases.values())
    return next(iter(tables)) if len(tables) == 1 else None


def filtered_tables(sql: str) -> list[str]:
    """Tables whose column the query compares with a string literal (`=`, `!=`, `LIKE`), in query order: the values a
    SAMPLE of the table shows before the query is written. Empty when none does or the query does not parse."""
    tree = _parse(sql)
    if tree is None:
        return []
    aliases = _aliases(tree)
    found: list[str] = []
    for node in tree.find_all(exp.EQ, exp.NEQ, exp.Like):
        sides = (node.this, node.expression)
        column = next((s for s in sides if isinstance(s, exp.Column)), None)
        literal = next((s for s in sides if isinstance(s, exp.Literal) and s.is_string), None)
        if column is None or literal is None:
            continue
        table = _table_of(column, aliases)
        if table and table.lower() not in {t.lower() for t in found}:
            found.append(table)
    return found


def broken_queries(sql: str, columns: Callable[[str], Iterable[str]], tables: Iterable[str]) -> list[str]:
    """`sql` with one selected column taken from the wrong place, each a query SQLite refuses with `no such column`:
    a qualified column under another alias of the query whose table lacks it (`T2.name` for `T1.name`), or an
    unqualified one of a single-table query replaced by a column of another table of the database. `columns(table)`
    lists a table's columns; `tables` are the database's tables. The caller checks each really fails."""
    tree = _parse(sql)
    if tree is None or not isinstance(tree, exp.Select):
        return []
    aliases = _aliases(tree)
    read = {t.lower() for t in aliases.values()}

    def has(table: str, name: str) -> bool:
        return name.lower() in {c.lower() for c in columns(table)}

    broken: list[str] = []
    for select in tree.selects:
        for column in select.find_all(exp.Column):
            original = column.sql(dialect="sqlite")
            if column.table:
                for alias, table in aliases.items():
                    if alias != column.table.lower() and alias != table.lower() and not has(table, column.name):
                        wrong = column.copy()
                        wrong.set("table", exp.to_identifier(alias.upper() if alias[:1] == "t" else alias))
                        broken.append(_replace_once(sql, original, wrong.sql(dialect="sqlite")))
                        break
            elif len(read) == 1:
                for other in tables:
                    if other.lower() in read:
                        continue
                    names = [c for c in columns(other) if not any(has(t, c) for t in aliases.values())]
                    if names:
                        broken.append(_replace_once(sql, column.name, names[0]))
                        break
    return [b for b in dict.fromkeys(broken) if b and b != sql]


def _replace_once(sql: str, old: str, new: str) -> str:
    """`sql` with the first whole-word occurrence of `old` (outside quotes) replaced by `new`; "" if none."""
    pattern = re.compile(r"(?<![\w.])" + re.escape(old) + r"(?![\w])", re.IGNORECASE)
    pieces = _QUOTED.split(sql)
    for index in range(0, len(pieces), 2):
        replaced, n = pattern.subn(new, pieces[index], count=1)
        if n:
            pieces[index] = replaced
            return "".join(pieces)
    return ""
