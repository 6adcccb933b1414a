"""Execution accuracy (EX), exactly as published Spider results compute it: test-suite-sql-eval's
`eval_exec_match` (Zhong et al., EMNLP 2020) with its default settings (`keep_distinct=False`,
`plug_value=False`) on the question's one database file (the official code runs both queries on every `.sqlite`
file in the database's folder; Spider's folders hold one).

An episode's EX is that of the agent's last QUERY that ran without error (no such QUERY: no match), scored
when the episode ends. For a predicted SQL `p` and the gold SQL `g` the official rules are:

1. `postprocess`: '> =', '< =' and '! =' are closed up in both texts;
2. `remove_distinct`: every token that reads DISTINCT (any case) is deleted from both texts, as sqlparse tokenizes
   them, and only the first statement of each text is kept (`official_sql`);
3. order matters when the gold text, after 1-2, contains "order by" anywhere (a substring test, subqueries and
   string literals included: `order_matters`);
4. `YEAR(CURDATE())` reads 2020 in both (`replace_cur_year`), then both run; a prediction that fails is wrong;
5. every row of both results is compared under `result_eq` (`sqlenv.scoring.result_eq.results_match`): the same row
   count and width, its quick rejection, then a column bijection under which the rows are equal as lists (order
   matters) or as multisets, with values compared as Python compares them (1 == 1.0, '1' != 1, 'Ann' != 'ann'). Text is decoded
   from UTF-8 dropping invalid bytes, as the official connection does.

test-suite-sql-eval's `evaluation.py` also replaces the word "value" in a prediction with 1 before calling
`eval_exec_match`; this module follows `eval_exec_match` and does not. The answer verifier (`sqlenv.scoring.verifier`)
stays the typed, lenient judge of an ANSWER; EX is the strict one, comparable with published figures.

Both queries run through the sandbox (`sqlenv.sandbox`): the prediction is the model's, so its time, memory and
result size stay bounded. Exact and bounded at once:

* the gold query runs once per question and database file in this process (its rows all kept, cached);
* the stored result of the episode's QUERY is reused when the official rules leave its text unchanged and it
  holds every row, decoded as the official code decodes it; otherwise (DISTINCT removed, a result cut at the
  sandbox's row cap) the official text runs again, fetching at most one row more than the gold has: a longer
  result already differs;
* the column search is bounded (`sqlenv.scoring.result_eq`).

Where the sandbox refuses or stops a statement (its time limit, SQLite heap, value length, program size, more
rows than `max_result_bytes` holds) the prediction counts as wrong, as a failed statement does; the official
code would wait for it. A gold query that cannot run, or whose rows do not fit in `max_result_bytes`, scores
every prediction wrong.

An episode scores EX once, on the thread that plays the step that ends it, within that step's time limit
(`deadline`): the official text of a prediction is another query than the one the step ran (DISTINCT dropped: a
cheap `count(DISTINCT j)` over a join can become an expensive one), so nothing that merely reads an episode (its
transcript, a server's `state` reply on the event loop) may run it. A query EX must run starts only with its whole
time limit left (`timeout_s`, less at most `max_uninterruptible_s`, what a statement may overrun it anyway), so
that its verdict is the sandbox's, not the step's: a step whose own query ran late used to leave EX's query a
fraction of a second (which its preparation, with no time check, overran by seconds: preparing is priced in the
sandbox now, `sqlenv.sandbox.prepare_cost`) and count the prediction wrong when it was stopped. With less time
left, `execution_match` raises `ExecutionNotScored`: the episode's EX is unknown, and its transcript says why.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlenv.scoring.result_eq import MAX_SEARCH_CELLS, quick_rejects, results_match
from sqlenv.sandbox.sandbox import Sandbox, SandboxError, SandboxSettings
from sqlenv.sandbox.sql_runner import QueryResult

__all__ = ["execution_match", "ExecutionNotScored", "official_sql", "order_matters", "replace_cur_year",
           "gold_result", "OfficialGold", "results_match", "quick_rejects", "MAX_SEARCH_CELLS"]

_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", flags=re.IGNORECASE)


# ------------------------------------------------------------------------------------------- the text rules

def replace_cur_year(sql: str) -> str:
    """`YEAR(CURDATE())` (any spacing and case, with the spaces after it) replaced by 2020, as the official
    runner does before executing either query."""
    return _CUR_YEAR.sub("2020", sql)


def official_sql(sql: str) -> str:
    """`sql` as the official rules run it (rules 1-2 of the module docstring): '> =' / '< =' / '! =' closed up,
    then the first statement as sqlparse splits it, without its tokens that read DISTINCT (whitespace kept)."""
    sql = sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
    # With no DISTINCT to drop and nothing sqlparse splits statements on (';', the keyword GO), the one statement
    # is the whole text: sqlparse's lexer keeps every character.
    if "distinct" not in sql.lower() and ";" not in sql and "GO" not in sql:
        return sql if sql.strip() else ""
    from sqlparse.engine import FilterStack  # imported when needed: most queries never reach here

    # The official code groups the statement (`sqlparse.parse`) before flattening it back into the same tokens;
    # grouping moves no token, so the ungrouped statement gives the same text without its cost.
    for statement in FilterStack().run(sql):
        return "".join(token.value for token in statement.flatten() if token.value.lower() != "distinct")
    return ""


def order_matters(gold_sql: str) -> bool:
    """Whether rows compare in order (rule 3): the gold text, after `official_sql`, contains "order by" in any
    case, wherever it stands (a subquery's ORDER BY counts; "order  by" with two spaces does not)."""
    return "order by" in official_sql(gold_sql).lower()


# -------------------------------------------------------------------------------------------- the running

def _official_text(data: bytes) -> str:
    """TEXT values as the official connection decodes them (`text_factory`): UTF-8, invalid bytes dropped."""
    return data.decode(errors="ignore")


class ExecutionNotScored(Exception):
    """EX could not be scored within the deadline it was given: too little of the step's time was left for a query
    it must run (module docstring). The message says how much; the episode's EX is unknown, not wrong."""


def _run(sandbox: Sandbox, db_name: str, sql: str, max_rows: int, settings: SandboxSettings,
         deadline: float | None = None) -> QueryResult:
    """Run `sql` in the sandbox (its text checks, authorizer, time and memory limits) with TEXT decoded as the
    official code decodes it, stopped at `deadline` (`time.monotonic()`) when that comes before its own time limit.
    Raises `SandboxError` when the sandbox refuses or stops it, and `ExecutionNotScored`, running nothing, when
    `deadline` leaves less than the time limit (within `max_uninterruptible_s`)."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left < settings.timeout_s - settings.max_uninterruptible_s:
            raise ExecutionNotScored(
                f"EX not scored: the step that ended the episode left {max(left, 0.0):.2f} s of the "
                f"{settings.timeout_s:g} s time limit of the query EX must run (the official text of the last "
                "QUERY, or the gold query).")
        if left < settings.timeout_s:
            settings = dataclasses.replace(settings, timeout_s=left)
    return sandbox.execute(db_name, sql, max_rows, settings=settings, text_factory=_official_text)


@dataclass(frozen=True)
class OfficialGold:
    """The gold query's result under the official rules: every row, and whether their order matters."""

    rows: list
    order_matters: bool

    @property
    def values(self) -> int:
        return len(self.rows) * (len(self.rows[0]) if self.rows else 0)


class GoldCache:
    """Official gold results shared by all environments of the process (read-only once built), least recently
    used first out, bounded by entries and by the values they hold."""

    def __init__(self, max_entries: int = 4096, max_values: int = 5_000_000):  # Spider dev's 1,034 hold 23k values
        self.max_entries, self.max_values = max_entries, max_values
        self._golds: OrderedDict[tuple, OfficialGold] = OrderedDict()
        self._values = 0
        self._lock = threading.Lock()

    def get(self, key: tuple) -> OfficialGold | None:
        with self._lock:
            gold = self._golds.get(key)
            if gold is not None:
                self._golds.move_to_end(key)
            return gold

    def put(self, key: tuple, gold: OfficialGold) -> None:
        with self._lock:
            if key in self._golds:  # another thread ran the same gold meanwhile
                return
            self._golds[key] = gold
            self._values += gold.values
            while len(self._golds) > 1 and (len(self._golds) > self.max_entries or self._values > self.max_values):
                _, old = self._golds.popitem(last=False)
                self._values -= old.values


_GOLD_CACHE = GoldCache()


def gold_result(sandbox: Sandbox, db_name: str, gold_sql: str, deadline: float | None = None) -> OfficialGold | None:
    """The gold result as the official rules compute it (`official_sql`, `replace_cur_year`, every row), once per
    database file, gold text and sandbox limits in this process; None when it cannot be had (the gold fails in
    the sandbox, or its rows do not fit in `max_result_bytes`). Raises `ExecutionNotScored` when it must run and
    `deadline` leaves less than its time limit. Failures are not cached: a gold stopped by a busy moment runs again
    next time."""
    try:
        identity = sandbox.database(db_name).identity
    except SandboxError:
        return None
    settings = sandbox.settings
    # What decides whether a gold's rows can be had (a gold that failed under other limits is not cached anyway);
    # not `dataclasses.astuple(settings)`, which took ~65 us, now that every reset warms this cache.
    key = (identity, gold_sql, settings.max_result_bytes, settings.max_value_bytes)
    gold = _GOLD_CACHE.get(key)
    if gold is not None:
        return gold
    text = official_sql(gold_sql)
    # The gold is trusted (the dataset's), so it may return more rows than the agent's queries keep; the byte cap
    # still holds. `n_rows` counts every row, so a result cut by the byte cap is seen and refused.
    gold_settings = dataclasses.replace(settings, count_rows_past_cap=True)
    try:
        result = _run(sandbox, db_name, replace_cur_year(text), max_rows=2**62, settings=gold_settings,
                      deadline=deadline)
    except SandboxError:
        return None
    if len(result.rows) != result.n_rows:
        return None
    gold = OfficialGold(result.rows, "order by" in text.lower())
    _GOLD_CACHE.put(key, gold)
    return gold


def _decoded_as_official(rows: list) -> bool:
    """Whether rows the sandbox decoded hold the text the official decoder gives: the sandbox decodes strictly and
    falls back to replacing invalid bytes with U+FFFD, so text without U+FFFD was valid UTF-8, which both decoders
    read alike."""
    for row in rows:
        for value in row:
            if type(value) is str and "\ufffd" in value:
                return False
    return True


def execution_match(sandbox: Sandbox, db_name: str, pred_sql: str | None, gold_sql: str,
                    pred_result: QueryResult | None = None, *, deadline: float | None = None) -> bool:
    """Whether `pred_sql` matches `gold_sql` on database `db_name` under test-suite-sql-eval's `eval_exec_match`
    with its default settings (module docstring).

    Raises `ExecutionNotScored` when `deadline` leaves a query it must run less than its time limit: nothing is
    run, and the match is unknown.

    Args:
        sandbox: the sandbox both queries run in.
        db_name: the question's database.
        pred_sql: the predicted SQL as the agent sent it (None: no prediction, no match).
        gold_sql: the question's gold SQL.
        pred_result: the sandbox's result of `pred_sql` when it already ran (the episode's QUERY): reused when the
            official rules leave its text unchanged and it holds every row; otherwise the official text runs.
        deadline: a `time.monotonic()` time by which any query this runs is stopped (default None: each runs
            within the sandbox's own time limit). A query starts only with its time limit left, within
            `max_uninterruptible_s` (else `ExecutionNotScored`); one stopped at it counts as failed: no match.
    """
    if not pred_sql:
        return False
    gold = gold_result(sandbox, db_name, gold_sql, deadline)
    if gold is None:
        return False
    text = replace_cur_year(official_sql(pred_sql))
    reusable = (pred_result is not None and text == pred_sql and len(pred_result.rows) == pred_result.n_rows
                and not pred_result.truncated and _decoded_as_official(pred_result.rows))
    if reusable:
        rows = pred_result.rows
    else:
        # One row more than the gold has is enough to know the prediction has more: no need to count the rest.
        settings = dataclasses.replace(sandbox.settings, count_rows_past_cap=False)
        try:
            result = _run(sandbox, db_name, text, len(gold.rows) + 1, settings, deadline)
        except SandboxError:
            return False  # the official runner scores a prediction that fails as wrong
        if len(result.rows) != result.n_rows:
            return False  # more rows than the gold's, or rows past the byte cap (module docstring): no match
        rows = result.rows
    return results_match(rows, gold.rows, gold.order_matters)
