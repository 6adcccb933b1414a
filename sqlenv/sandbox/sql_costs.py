"""What one SQL statement may cost between two time checks: the price of every function the sandbox allows.

SQLite reads its interrupt flag and calls the progress handler only at the jumps that close a loop. The
instructions between two such jumps run without a check, and a function call is one instruction, however long
it runs: one result row of 800 `trim(x, y)` calls over a 9,000-character `x` and an 820-character `y` ran 19-22 s
against a 5 s limit (issue 35). What one stretch without a check can cost is bounded here, in three parts:

- how many instructions a statement has (`SandboxSettings.max_program_ops`), and how long the values and patterns
  they work on may be (`max_value_bytes`, `max_like_pattern_chars`, `max_function_args`);
- a price for every function: its worst time per call with arguments at those limits, measured by
  `bench/security/sql_function_costs.py` (the table in docs/SECURITY.md). The authorizer refuses every function without
  a price (`ALLOWED_FUNCTIONS`), so a function nobody measured never runs;
- before a statement runs, its program as `EXPLAIN` lists it (after SQLite's own rewriting: flattening a
  subquery copies its expressions into every reference, so one call in the text can be hundreds in the program)
  is priced: the worst times of all its function calls, summed, may not exceed `max_uninterruptible_s`. A stretch
  between two checks runs a subset of those calls, so it costs at most that much; the rest of its instructions
  each handle at most one value (microseconds).

The functions whose cost is the product of two lengths are the ones that matter: `trim`/`ltrim`/`rtrim` with a
character set (every stripped character is compared with every character of the set), `LIKE`/`GLOB` (a pattern
starting with a wildcard is tried at every position of the value; a `GLOB` class is read whole at each),
`instr`/`replace` (a comparison at every position) and `json_patch` (every key against every key). Every other
function reads its arguments a bounded number of times. Pricing costs one `EXPLAIN` (~0.1 ms) and only runs when
the text (or the database's schema: a view or a generated column is code too) names a function whose calls
could add up past the bound within `max_program_ops` instructions; the verdict on a short text is cached.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

__all__ = ["Price", "FUNCTION_PRICES", "ALLOWED_FUNCTIONS", "DEFAULT_LIMITS", "call_price", "costly_names",
           "names_costly_function", "program_price", "too_costly"]

#: The limits the prices were measured at (`SandboxSettings`' defaults): value bytes, pattern bytes, arguments.
DEFAULT_LIMITS = {"L": 10_000, "P": 100, "A": 32}


@dataclass(frozen=True)
class Price:
    """The worst time of one call.

    Args:
        seconds: measured worst time of one call at `DEFAULT_LIMITS` (one core, `bench/security/sql_function_costs.py`,
            rounded up).
        growth: how that time grows with the limits: "1" (a constant), "L" (the value bytes), "LA" (value bytes
            times arguments), "LP" (value bytes times pattern bytes), "LL" (value bytes squared).
        what: the worst case, in words (for docs/SECURITY.md and refusals).
    """

    seconds: float
    growth: str
    what: str = ""

    def at(self, limits: dict[str, int]) -> float:
        """The worst time of one call under `limits` (keys as `DEFAULT_LIMITS`)."""
        scale = 1.0
        for letter in self.growth.replace("1", ""):
            scale *= limits[letter] / DEFAULT_LIMITS[letter]
        return self.seconds * scale


_CONSTANT = Price(5e-6, "1", "numbers in, a number out")
_LINEAR = Price(60e-6, "L", "one pass over a value")
_LINEAR_ARGS = Price(60e-6, "LA", "one pass over each argument")
_DATES = Price(1e-3, "LA", "a date or format parsed, then each modifier argument")
_JSON = Price(150e-6, "L", "one parse of a JSON value")
_JSON_PATHS = Price(1e-3, "LA", "a parse, then a walk for each path argument")

_GROUPS = {
    _CONSTANT: ("abs(1) acos(1) acosh(1) asin(1) asinh(1) atan(1) atan2(2) atanh(1) avg(1) ceil(1) ceiling(1) "
                "changes(0) count(0) count(1) cume_dist(0) current_date(0) current_time(0) current_timestamp(0) "
                "degrees(1) dense_rank(0) exp(1) floor(1) ifnull(2) iif(3) last_insert_rowid(0) likelihood(2) "
                "likely(1) ln(1) log(1) log(2) log10(1) log2(1) mod(2) ntile(1) nullif(2) percent_rank(0) pi(0) "
                "pow(2) power(2) radians(1) random(0) rank(0) round(1) round(2) row_number(0) sign(1) sin(1) "
                "sinh(1) sqlite_compileoption_get(1) sqlite_compileoption_used(1) sqlite_source_id(0) "
                "sqlite_version(0) sqrt(1) subtype(1) sum(1) tan(1) tanh(1) total(1) total_changes(0) trunc(1) "
                "typeof(1) unlikely(1)"),
    _LINEAR: ("first_value(1) group_concat(1) group_concat(2) hex(1) lag(1) lag(2) lag(3) last_value(1) lead(1) "
              "lead(2) lead(3) length(1) lower(1) ltrim(1) max(1) min(1) nth_value(2) quote(1) randomblob(1) "
              "rtrim(1) soundex(1) substr(2) substr(3) substring(2) substring(3) trim(1) unicode(1) upper(1) "
              "zeroblob(1)"),
    _LINEAR_ARGS: "char(-1) coalesce(-1) max(-1) min(-1)",
    _DATES: "date(-1) datetime(-1) julianday(-1) strftime(-1) time(-1) unixepoch(-1)",
    _JSON: ("json(1) json_array(-1) json_array_length(1) json_group_array(1) json_group_object(2) json_object(-1) "
            "json_quote(1) json_type(1) json_valid(1)"),
    _JSON_PATHS: ("->(2) ->>(2) json_array_length(2) json_extract(-1) json_insert(-1) json_remove(-1) "
                  "json_replace(-1) json_set(-1) json_type(2)"),
}

#: Every function the sandbox allows, as `EXPLAIN` names it ("name(number of arguments)", -1: any number), with
#: its price. The product-cost functions are priced one by one.
FUNCTION_PRICES: dict[str, Price] = {key: price for price, keys in _GROUPS.items() for key in keys.split()}
FUNCTION_PRICES.update({
    "trim(2)": Price(0.030, "LL", "every character of the value against every character of the set "
                                  "(at most L/12 characters: SQLite's own bound)"),
    "ltrim(2)": Price(0.030, "LL", "as trim(x, y), from one end"),
    "rtrim(2)": Price(0.030, "LL", "as trim(x, y), from one end"),
    "like(2)": Price(0.002, "LP", "a pattern tried at every position of the value"),
    "like(3)": Price(0.002, "LP", "as LIKE"),
    "glob(2)": Price(0.003, "LP", "a pattern tried at every position, a [class] read whole at each"),
    "instr(2)": Price(0.0005, "LL", "a comparison at every position"),
    "replace(3)": Price(0.0005, "LL", "a comparison at every position"),
    "json_patch(2)": Price(0.004, "LL", "every key of the patch against every key of the target"),
})

#: Names the authorizer lets a statement call (the prices' names); every other function is refused.
ALLOWED_FUNCTIONS = frozenset(key.rsplit("(", 1)[0] for key in FUNCTION_PRICES)

#: What an unknown entry of a program is priced at (none is expected: the authorizer allows only priced names).
_UNKNOWN = max(FUNCTION_PRICES.values(), key=lambda price: price.seconds)

# The instructions that call a function (a scalar one, or an aggregate's or window's steps), as EXPLAIN names them.
_CALL_OPCODES = frozenset({"Function", "PureFunc", "AggStep", "AggStep1", "AggInverse", "AggValue", "AggFinal"})


def limits_of(settings) -> dict[str, int]:
    """The limits a `SandboxSettings` sets, keyed as `DEFAULT_LIMITS`."""
    return {"L": settings.max_value_bytes, "P": settings.max_like_pattern_chars, "A": settings.max_function_args}


def call_price(key: str, settings) -> float:
    """The worst time of one call of `key` ("name(arguments)") under `settings`' limits."""
    return FUNCTION_PRICES.get(key, _UNKNOWN).at(limits_of(settings))


def costly_names(settings) -> frozenset[str]:
    """The names to look for in a text: those of the functions whose calls could add up past
    `max_uninterruptible_s` within `max_program_ops` instructions (a statement that names none of them needs no
    pricing), shortest first ("trim" stands for "ltrim" too); every name when even the cheapest could.

    A call is one instruction, and each of its arguments one more (evaluated at the call, or once before the first),
    so a function whose price grows with its arguments ("A") costs at most its price over A per instruction: the
    date functions (31 modifiers of 10 KB each at worst) and JSON paths never add up past the bound."""
    free = settings.max_uninterruptible_s / settings.max_program_ops
    limits = limits_of(settings)
    names = {key.rsplit("(", 1)[0] for key, price in FUNCTION_PRICES.items()
             if price.at(limits) / (limits["A"] if "A" in price.growth else 1) > free}
    # A text that names "ltrim" names "trim": the shortest names are enough to look for.
    return frozenset(name for name in names if not any(other != name and other in name for other in names))


def names_costly_function(text: str, names: frozenset[str]) -> bool:
    """Whether `text` (SQL, or a schema's SQL) could call one of `names`. SQLite matches function names without
    regard to ASCII case and a name cannot be split (quoting keeps its letters), so a text that does not contain
    one, in any case, cannot call it."""
    lowered = text.lower()
    for name in names:
        if name in lowered:
            return True
    return False


def program_price(conn: sqlite3.Connection, sql: str, settings) -> tuple[float, dict[str, int]]:
    """The summed worst time of the function calls in `sql`'s program on `conn`, and how many calls of each
    function it holds. Prepares the statement (`EXPLAIN`: the program is listed, not run); SQLite's errors
    (syntax, authorizer) propagate as they would from running it."""
    counts: dict[str, int] = {}
    for row in conn.execute("EXPLAIN " + sql):
        if row[1] in _CALL_OPCODES:
            key = str(row[5])
            counts[key] = counts.get(key, 0) + 1
    return sum(call_price(key, settings) * n for key, n in counts.items()), counts


def too_costly(total: float, counts: dict[str, int], settings) -> str:
    """The refusal of a statement whose calls are priced at `total` seconds (`program_price`)."""
    costly = sorted(((call_price(key, settings) * n, key, n) for key, n in counts.items()), reverse=True)[:3]
    listed = ", ".join(f"{n} x {key.rsplit('(', 1)[0]} (up to {call_price(key, settings) * 1000:.1f} ms each)"
                       for _, key, n in costly)
    return (f"Query refused: its function calls could run for {total:.1f} s without a check of the time limit "
            f"(limit {settings.max_uninterruptible_s:g} s; {listed}). Call costly functions (trim with a character "
            "set, LIKE/GLOB, instr, replace, JSON paths) fewer times in one query.")
