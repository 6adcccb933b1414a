"""What preparing one statement may cost. SQLite checks no time limit while it prepares a statement (neither the
interrupt nor the progress handler runs then), and some short texts take seconds and the whole heap to prepare.

The cause is copying, before any code is made. SQLite copies a common table expression's definition into every
reference to it (materialized or not), and when it flattens a subquery of a FROM clause into its query, it copies
the subquery's expression for a column into every use of that column. A copy made at one level is copied again at
the next: 15 nested subqueries whose column is used three times at each level are 3^14 copies (470 characters:
~1.5 s until the 512 MiB heap was full, 8.5 s on a loaded server); 18 CTEs that each read the one before twice are
2^17 (870 characters, 2.1 s). Preparing the official text of such a prediction is what made an episode's last
step end seconds past its time limit (issue 43).

An alias is copied too: one named in WHERE, GROUP BY, HAVING or ORDER BY is resolved by copying its expression
(10,000 characters, one SELECT: 1.9 s).

Before a statement is prepared its text is priced here, from its tokens alone (`expansion`): an upper bound of the
nodes those copies can make. Each query block (the whole text, and each parenthesized SELECT, VALUES or WITH)
counts

- its own tokens;
- every query block inside it, and a whole copy of every CTE it names;
- for each use of a column in it, the largest expression that use can be replaced by: an item of the select list
  of one of its FROM clause's subqueries or of a CTE it names (each item priced the same way, a scalar subquery in
  it whole), or of an enclosing block's (a correlated use); outside its select list, of its own select list too.

A statement whose bound exceeds `SandboxSettings.max_prepare_nodes` is refused before SQLite sees it. Only a text
with two SELECTs, a WITH, or more characters than its aliases could copy past the bound is priced (`may_copy`:
Spider's gold queries, 15% of them, at ~40 us each), and the verdict on a short text is cached.
"""

from __future__ import annotations

import functools
import math
import re

__all__ = ["expansion", "cached_expansion", "may_copy", "too_costly_to_prepare", "MAX_NESTING"]

#: Most query blocks nested in one another that are priced (the pricing recurses through them); a deeper text is
#: priced past any bound. SQLite's own parser refuses far less (17 levels of subqueries in FROM).
MAX_NESTING = 100

# Strings, quoted names, comments (dropped), words, numbers, parentheses, any other character. Each alternative
# starts with a character the others do not (or is the last resort), so the scan is linear.
_TOKEN = re.compile(r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?|--[^\n]*|/\*.*?(?:\*/|\Z)
                        |[A-Za-z_][A-Za-z0-9_$]*|[0-9.]+|[()]|\S""", re.X | re.S)

# Words that never name a column or a CTE (SQLite's keywords that a SELECT can hold).
_KEYWORDS = frozenset("""
    all and as asc between by case cast collate cross current current_date current_time current_timestamp desc
    distinct else end escape except exclude exists filter first following from full glob group groups having if in
    indexed inner intersect is isnull join last left like limit match materialized natural not notnull null nulls
    offset on or order others outer over partition preceding range recursive regexp right row rows select then ties
    unbounded union using values when where window with without
""".split())
# Keywords that start a part of a query block other than its select list and FROM clause.
_OTHER_PARTS = frozenset("where group having order limit window on using".split())


class _Item:
    """One expression of a select list: what a use of its column can be replaced by, once copied."""
    __slots__ = ("tokens", "columns", "blocks")

    def __init__(self) -> None:
        self.tokens = 0
        self.columns = 0
        self.blocks: list[_Block] = []  # query blocks inside it (a scalar subquery is copied with it)


class _Block:
    """A query block: the whole text, or a parenthesized SELECT, VALUES or WITH (a parenthesized expression
    belongs to the block around it)."""
    __slots__ = ("tokens", "columns", "names", "sources", "others", "ctes", "items", "part", "state", "pending",
                 "size", "item_size")

    def __init__(self) -> None:
        self.tokens = 0
        self.columns = 0  # identifiers that may be a column's use
        self.names: list[str] = []  # identifiers, lowercased (those that name a CTE are its references)
        self.sources: list[_Block] = []  # query blocks of its FROM clause
        self.others: list[_Block] = []  # every other query block in it (subqueries that may use its columns)
        self.ctes: list[_Block] = []  # the definitions of its WITH clause
        self.items: list[_Item] = []
        self.part = ""  # "list", "from" or "" (elsewhere)
        # Reading a WITH clause: "name" (a CTE's name comes next), "as" (its columns, or AS), "body" (its
        # definition opens next), "after" (a comma and the next CTE, or the statement); and the name.
        self.state = ""
        self.pending = ""
        self.size: int | None = None  # priced (None: not yet; -1: being priced, a recursive CTE's own name)
        self.item_size = 0


def _parse(sql: str) -> tuple[_Block, dict[str, list[_Block]], int]:
    """The text's query blocks (the whole text first), its CTEs (each name with the blocks that define it) and how
    deep its query blocks nest."""
    top = _Block()
    stack: list[_Block | None] = [top]  # None: a parenthesized expression inside the block below it
    ctes: dict[str, list[_Block]] = {}
    # An ASCII text is read lower-cased (no token changes its class or its bounds), not each token lower-cased.
    tokens = _TOKEN.findall(sql.lower() if sql.isascii() else sql)
    if "--" in sql or "/*" in sql:
        tokens = [token for token in tokens if token[:2] not in ("--", "/*")]
    lowers = tokens if sql.isascii() else [token.lower() for token in tokens]
    block, item, previous = top, None, ""
    depth = deepest = 1
    for i, token in enumerate(tokens):
        block.tokens += 1
        if item is not None:
            item.tokens += 1
        lowered = lowers[i]
        if token == "(":
            following = lowers[i + 1] if i + 1 < len(tokens) else ""
            if following not in ("select", "values", "with"):
                stack.append(None)
            else:
                child = _Block()
                if block.state == "body":
                    ctes.setdefault(block.pending, []).append(child)
                    block.ctes.append(child)
                    block.state = "after"
                elif block.part == "from" and previous in ("from", "join", ","):
                    block.sources.append(child)
                else:
                    block.others.append(child)
                    if item is not None:
                        item.blocks.append(child)
                stack.append(child)
                block, item = child, None
                depth += 1
                deepest = max(deepest, depth)
        elif token == ")":
            if len(stack) > 1 and stack.pop() is not None:
                depth -= 1
                block = next(entry for entry in reversed(stack) if entry is not None)
                item = block.items[-1] if block.part == "list" and block.items else None
        elif lowered == "," and block.part == "list" and stack[-1] is block:
            item = _Item()
            block.items.append(item)
        elif token == ",":
            if block.state == "after":
                block.state = "name"
        elif token[0].isalpha() or token[0] in "_\"`[":
            quoted = token[0] in "\"`["
            word = lowered[1:-1] if quoted else lowered
            if not quoted and word in _KEYWORDS:
                if stack[-1] is block:  # the block's own keywords, not a parenthesized expression's
                    if word == "select":
                        block.part, item = "list", _Item()
                        block.items.append(item)
                    elif word in ("from", "join"):
                        block.part, item = "from", None
                    elif word in _OTHER_PARTS or word in ("union", "intersect", "except", "values"):
                        block.part, item = "", None
                if word == "with":
                    block.state = "name"
                elif word == "as" and block.state == "as":
                    block.state = "body"
                elif not (word in ("recursive", "not", "materialized") and block.state in ("name", "body")):
                    block.state = ""  # the statement after the WITH clause, or no WITH clause at all
            else:
                if block.state == "name":
                    block.state, block.pending = "as", word
                block.names.append(word)
                following = tokens[i + 1] if i + 1 < len(tokens) else ""
                # A column's use, not: a name given with AS, a function's name (or a CTE's, before its column
                # list), the table or alias that qualifies a column (`t.c` uses one column), a table or alias of
                # the FROM clause (its ON conditions are another part).
                if previous != "as" and following not in ("(", ".") and block.part != "from":
                    block.columns += 1
                    if item is not None:
                        item.columns += 1
        previous = lowered
    return top, ctes, deepest


def _price(block: _Block, ctes: dict[str, list[_Block]], context: int, cap: int, depth: int = 0) -> int:
    """The bound of `block`'s copies (`block.size`), given the most a use of a column of an enclosing block's source
    can be replaced by (`context`); sets `block.item_size`, the most a use of one of its own columns can be.
    `depth` counts the blocks the pricing is inside: nesting and CTEs naming CTEs alike (a chain of 1,100 CTEs,
    each naming the next, fits in 20,000 characters); past MAX_NESTING the block is priced past any bound."""
    if block.size is not None:
        return 1 if block.size < 0 else block.size
    if depth > MAX_NESTING:
        block.size = block.item_size = cap + 1
        return block.size
    block.size, block.item_size = -1, 1
    total = block.tokens
    for body in block.ctes:  # defined here, copied where they are named
        _price(body, ctes, context, cap, depth + 1)
    largest = context  # what a use of a column here can be replaced by
    for source in block.sources:
        total += _price(source, ctes, context, cap, depth + 1)
        largest = max(largest, source.item_size)
    for name in block.names if ctes else ():  # (a text without WITH names no CTE)
        for body in ctes.get(name, ()):
            total += _price(body, ctes, context, cap, depth + 1)
            largest = max(largest, body.item_size)
        if total > cap:
            break
    for other in block.others:  # subqueries in its other parts may use its sources' columns
        if total > cap:
            break
        total += _price(other, ctes, largest, cap, depth + 1)
    item_size, listed = 1, 0
    for item in block.items:
        copied = sum(max(sub.size or 0, 0) for sub in item.blocks)  # a scalar subquery is copied with its item
        item_size = max(item_size, item.tokens + item.columns * largest + copied)
        listed += item.columns
    # A use of a column may be replaced by a source's expression; outside the select list, by one of this block's
    # own too (an alias named in WHERE, GROUP BY, HAVING or ORDER BY is resolved by copying its expression).
    total += listed * largest + (block.columns - listed) * max(largest, item_size)
    block.size, block.item_size = min(cap + 1, total), min(cap + 1, item_size)
    return block.size


def expansion(sql: str, cap: int) -> int:
    """An upper bound of the expression nodes SQLite can make when it prepares `sql`, copying CTEs into their
    references and flattened subqueries' expressions into their columns' uses (module docstring); at most
    `cap + 1` (the pricing stops there)."""
    top, ctes, deepest = _parse(sql)
    return cap + 1 if deepest > MAX_NESTING else _price(top, ctes, 0, cap)


def may_copy(lowered: str, limit: int) -> bool:
    """Whether a statement (its text in lower case) could make more than `limit` copies: with two SELECTs or a
    WITH; with one, only through its aliases (one named n times is copied n times), so only past 4 * sqrt(limit)
    characters (a text of c characters has at most c/4 uses of an alias and c/4 nodes in its expression)."""
    return "with" in lowered or lowered.count("select") > 1 or len(lowered) > 4 * math.isqrt(limit)


@functools.lru_cache(maxsize=1024)
def cached_expansion(sql: str, cap: int) -> int:
    """`expansion`, kept for short texts (`sqlenv.sandbox.sql_checks.cacheable_text`)."""
    return expansion(sql, cap)


def too_costly_to_prepare(nodes: int, limit: int) -> str:
    """The refusal of a statement whose preparation is priced at `nodes` (`expansion`)."""
    shown = f"more than {limit:,}" if nodes > limit else f"{nodes:,}"
    return (f"Query refused: preparing it could copy {shown} expressions (limit {limit:,}): SQLite copies a CTE "
            "into every reference to it and a subquery's column expressions into every use of the column, with "
            "no time check while it does. Reference each CTE or subquery column fewer times, or nest fewer "
            "levels.")
