"""The typed answer verifier (terminal reward) and the canonical answer text.

`verify_answer` is lenient about form and strict about content: wrappers (code fences, "Answer:", quotes)
are stripped, numbers are coerced, strings compare case- and whitespace-insensitively, lists and tables
compare as multisets (tables in order only when the gold SQL orders its result).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from typing import Any, Sequence

from sqlenv.agent.fences import ANSWER_FENCE_OPENING, fence_body

FLOAT_REL_TOL = 0.01  # floats match within 1% (relative)
FLOAT_ABS_TOL = 1e-9  # ... or this close to a gold value of 0
EMPTY_ANSWERS = {"[]", "[[]]", "none", "no results", "no result", "no rows", "empty", "null", "nothing", "n/a"}
MAX_ITEMS = 10_000  # more predicted items than this is never right and would only cost time
# The answer is sized before it is split (a 15 MB table answer cost 4.5 s of Python splitting it before the item
# check): longer text, or more separators than cells a gold result has, is never right. Spider's longest canonical
# answer has 188,887 characters and its largest gold result 19,918 cells; both bounds are 5 times that.
MAX_ANSWER_CHARS = 1_000_000
MAX_CELLS = 100_000

_ANSWER_PREFIX_RE = re.compile(r"^(?:final\s+)?answer\s*[:=]\s*", re.IGNORECASE)
_QUOTES = {'"': '"', "'": "'", "`": "`", "“": "”", "‘": "’"}
_SEPARATOR_ROW_RE = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


# ------------------------------------------------------------------------------------------ text helpers

def strip_wrappers(text: Any) -> str:
    """The answer without surrounding code fences, a leading "Answer:", quotes or whitespace."""
    if text is None:
        return ""
    text = str(text).replace("\x00", "").strip()
    for _ in range(4):
        before = text
        body = fence_body(text, ANSWER_FENCE_OPENING)  # linear: the regular expression it replaces was quadratic
        if body is not None:
            text = body.strip()
        text = _ANSWER_PREFIX_RE.sub("", text).strip()
        if len(text) >= 2 and text[0] in _QUOTES and text[-1] == _QUOTES[text[0]] \
                and text[0] not in text[1:-1]:
            text = text[1:-1].strip()
        if text == before:
            break
    return text


def _squash(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def to_number(value: Any) -> float | None:
    """`value` as a finite float ("3", " 3.0 ", "1,234", 3) or None when it is not a number."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None:
        return None
    text = str(value).strip().strip("$€£%").strip()
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    if not _NUMBER_RE.match(text):
        return None
    f = float(text)
    return f if math.isfinite(f) else None


def _numbers_equal(p: float, g: float, integer: bool) -> bool:
    if integer:
        return p == g
    return abs(p - g) <= max(FLOAT_REL_TOL * abs(g), FLOAT_ABS_TOL)


def cell_equal(pred: Any, gold: Any) -> bool:
    """One value against one gold value: integers exactly, other numbers within 1%, text loosely."""
    g = to_number(gold)
    if g is not None:
        p = to_number(_unquote(pred))
        if p is None:
            return False
        integer = isinstance(gold, int) or (isinstance(gold, str) and re.fullmatch(r"\s*[+-]?\d+\s*", gold) is not None)
        return _numbers_equal(p, g, integer)
    if gold is None:
        return _squash(_unquote(pred)) in ("null", "none", "")
    p, g = _squash(_unquote(pred)), _squash(gold)
    return p == g or (p.endswith(".") and p[:-1].rstrip() == g)  # a sentence-final period is not content


def _unquote(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if len(text) >= 2 and text[0] in _QUOTES and text[-1] == _QUOTES[text[0]]:
            return text[1:-1].strip()
        return text
    return value


def _key(value: Any) -> tuple:
    """A hashable key under which equal cells collide (numbers rounded, text squashed)."""
    value = _unquote(value)
    n = to_number(value)
    if n is not None:
        return ("n", round(n, 9))
    if value is None:
        return ("null",)
    return ("s", _squash(value))


def _json(text: str) -> Any:
    if text[:1] not in "[{":
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _scalar_text(text: str) -> str:
    """A single value out of forms like `[3]`, `[[3]]` or `(3)`."""
    data = _json(text)
    while isinstance(data, list) and len(data) == 1:
        data = data[0]
    if data is not None and not isinstance(data, (list, dict)):
        return str(data)
    if text.startswith("(") and text.endswith(")") and text.count("(") == 1:
        return text[1:-1].strip()
    return text


def parse_list(text: str) -> list:
    """Items of a list answer: a JSON list (nested single-item lists flattened), else newline- or
    comma-separated text. Empty items are dropped."""
    data = _json(text)
    if isinstance(data, list):
        out = []
        for item in data:
            while isinstance(item, list) and len(item) == 1:
                item = item[0]
            out.append(item)
        return out
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    sep = "\n" if "\n" in text else ","
    items = [_unquote(i.strip().lstrip("-*•").strip()) if sep == "\n" else _unquote(i) for i in text.split(sep)]
    return [i for i in items if i != ""]


def parse_table(text: str) -> list[list]:
    """Rows of a table answer: a JSON list of lists, else one row per line with cells split on `|`
    (markdown borders and separator lines tolerated)."""
    data = _json(text)
    if isinstance(data, list):
        return [list(r) if isinstance(r, (list, tuple)) else [r] for r in data]
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or _SEPARATOR_ROW_RE.match(line):
            continue
        if len(line) > 1 and (line.startswith("|") or line.endswith("|")):
            line = line.strip("|")  # markdown borders (or a stray trailing pipe)
        if "|" in line:
            rows.append([_unquote(c) for c in line.split("|")])
        elif "\t" in line:
            rows.append([_unquote(c) for c in line.split("\t")])
        else:
            rows.append([_unquote(line)])
    return rows


# ------------------------------------------------------------------------------------------- matching

def multiset_equal(pred: Sequence, gold: Sequence, ordered: bool, equal) -> bool:
    """Whether `pred` and `gold` hold the same items (rows or values) under `equal(pred_item, gold_item)`: in
    order when `ordered`, else as multisets. Exact keys pair most items at once; at most 500 items left over are
    then paired with `equal`'s tolerance (more is never a match: the cost stays bounded)."""
    if len(pred) != len(gold):
        return False
    if ordered:
        return all(equal(p, g) for p, g in zip(pred, gold))
    # Exact keys first (fast, handles nearly every case), then pair what is left with tolerance.
    key = _row_key if pred and isinstance(gold[0], (list, tuple)) else _key
    left_pred = Counter(key(p) for p in pred)
    left_gold = Counter(key(g) for g in gold)
    common = left_pred & left_gold
    rest_pred = _leftovers(pred, key, Counter(common))
    rest_gold = _leftovers(gold, key, Counter(common))
    if len(rest_pred) > 500:
        return False
    used = [False] * len(rest_pred)
    for g in rest_gold:
        for i, p in enumerate(rest_pred):
            if not used[i] and equal(p, g):
                used[i] = True
                break
        else:
            return False
    return True


def _leftovers(items: Sequence, key, matched: Counter) -> list:
    out = []
    for item in items:
        k = key(item)
        if matched[k] > 0:
            matched[k] -= 1
        else:
            out.append(item)
    return out


def _row_key(row: Sequence) -> tuple:
    if not isinstance(row, (list, tuple)):
        row = [row]
    return tuple(_key(v) for v in row)


def _rows_equal(pred: Sequence, gold: Sequence) -> bool:
    if not isinstance(pred, (list, tuple)):
        pred = [pred]
    return len(pred) == len(gold) and all(cell_equal(p, g) for p, g in zip(pred, gold))


def _is_empty_gold(gold: Any, gold_rows: Any) -> bool:
    if gold_rows is not None:
        return len(gold_rows) == 0
    return gold is None or (isinstance(gold, (list, tuple, str)) and len(gold) == 0)


def verify_answer(predicted: Any, gold: Any, answer_type: str, gold_rows: Sequence | None = None, *,
                  ordered: bool | None = None, gold_sql: str | None = None,
                  columns: Sequence[str] | None = None) -> bool:
    """Whether `predicted` (the agent's ANSWER text) matches the gold answer.

    Args:
        predicted: the answer text (wrappers such as code fences, "Answer:" and quotes are stripped).
        gold: the question's `gold_answer` (number, string, list of scalars or list of rows).
        answer_type: integer | float | string | list | table.
        gold_rows: optional raw gold result rows; when given they define the gold table/list, and an
            empty list marks an empty gold result.
        ordered: compare table rows in order (default: only when `gold_sql` has a top-level ORDER BY).
        gold_sql: the gold query, used to decide `ordered` when it is not given.
        columns: the gold result's column names; a list/table answer whose first line repeats them (a
            header copied from a QUERY result) is read without that line.
    """
    try:
        return _verify(predicted, gold, answer_type, gold_rows, ordered, gold_sql, columns)
    except (RecursionError, MemoryError, OverflowError, ValueError, TypeError):
        return False


def _is_header(row: Sequence, columns: Sequence[str] | None) -> bool:
    return bool(columns) and len(row) == len(columns) and all(
        _squash(_unquote(c)) == _squash(name) for c, name in zip(row, columns))


def _separators(text: str) -> int:
    """How many pieces `text` could split into, less one: every way the list and table readers split (JSON
    commas, lines, cells) needs one of these characters between two items. Counted in C, before any split."""
    return text.count(",") + text.count("\n") + text.count("|") + text.count("\t")


def _verify(predicted, gold, answer_type, gold_rows, ordered, gold_sql, columns) -> bool:
    raw = "" if predicted is None else predicted if isinstance(predicted, str) else str(predicted)
    if len(raw) > MAX_ANSWER_CHARS:
        return False
    text = strip_wrappers(raw)
    if not text:
        return False
    if _is_empty_gold(gold, gold_rows):
        return _squash(text) in EMPTY_ANSWERS
    answer_type = (answer_type or "string").lower()

    if answer_type in ("integer", "float"):
        g = gold
        while isinstance(g, (list, tuple)) and len(g) == 1:
            g = g[0]
        g_num = to_number(g)
        p_num = to_number(_scalar_text(text))
        if g_num is None:
            return _squash(_scalar_text(text)) == _squash(g)
        if p_num is None:
            return False
        return _numbers_equal(p_num, g_num, answer_type == "integer" and float(g_num).is_integer())

    if answer_type == "string":
        g = gold
        while isinstance(g, (list, tuple)) and len(g) == 1:
            g = g[0]
        return cell_equal(_scalar_text(text), g)

    if _separators(text) >= MAX_CELLS:  # lists and tables: more items than any gold result, never split
        return False
    if answer_type == "list":
        gold_items = _flatten_gold_list(gold if gold_rows is None else gold_rows)
        pred_items = parse_list(text)
        if len(pred_items) > MAX_ITEMS:
            return False
        if pred_items and len(pred_items) == len(gold_items) + 1 and _is_header(pred_items[:1], columns):
            pred_items = pred_items[1:]
        return multiset_equal(pred_items, gold_items, False, cell_equal)

    # table
    gold_table = [list(r) if isinstance(r, (list, tuple)) else [r] for r in (gold if gold_rows is None else gold_rows)]
    pred_rows = parse_table(text)
    if len(pred_rows) > MAX_ITEMS:
        return False
    width = len(gold_table[0]) if gold_table else 0
    if width == 1 and len(pred_rows) == 1 and len(gold_table) > 1:
        pred_rows = [[i] for i in parse_list(text)]  # a one-column table written as a list
    if pred_rows and len(pred_rows) == len(gold_table) + 1 and _is_header(pred_rows[0], columns):
        pred_rows = pred_rows[1:]  # a header line copied from a QUERY result
    if len(pred_rows) != len(gold_table) or set(map(len, pred_rows)) != {width}:
        return False  # a row of another width never equals a gold row: no cell is keyed
    if ordered is None:  # parsed only here: only a table's rows keep their order (a sqlglot parse, ~1 ms)
        from sqlenv.sandbox.sql_checks import has_top_level_order_by

        ordered = bool(gold_sql) and has_top_level_order_by(gold_sql)
    return multiset_equal(pred_rows, gold_table, ordered, _rows_equal)


def _flatten_gold_list(gold: Any) -> list:
    if not isinstance(gold, (list, tuple)):
        return [gold]
    out = []
    for item in gold:
        while isinstance(item, (list, tuple)) and len(item) == 1:
            item = item[0]
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    return out


# --------------------------------------------------------------------------------------- canonical text

def _fmt(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.10g}"
    return str(value)


def format_answer(gold_answer: Any, answer_type: str) -> str:
    """The canonical answer text (what the oracle and SFT examples answer with).

    A single value for integer/float/string; a comma-separated list for list; `a | b` rows, one per line,
    for table; `[]` when the result is empty. Lists or tables whose values contain the separators fall back
    to JSON, which the verifier reads too.
    """
    answer_type = (answer_type or "string").lower()
    if gold_answer is None or (isinstance(gold_answer, (list, tuple, str)) and len(gold_answer) == 0):
        return "[]"  # what the verifier accepts for an empty gold result
    if answer_type in ("integer", "float", "string"):
        value = gold_answer
        while isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if answer_type == "integer":
            n = to_number(value)
            if n is not None and n.is_integer():
                return str(int(n))
        return _fmt(value)
    if answer_type == "list":
        items = [_fmt(v) for v in _flatten_gold_list(gold_answer)]
        if any(("," in i) or ("\n" in i) or i != i.strip() or i == "" for i in items):
            return json.dumps(_flatten_gold_list(gold_answer), ensure_ascii=False)
        return ", ".join(items)
    rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in gold_answer]
    cells = [[_fmt(v) for v in r] for r in rows]
    if any(("|" in c) or ("\n" in c) or c != c.strip() or c == "" for r in cells for c in r):
        return json.dumps(rows, ensure_ascii=False)
    return "\n".join(" | ".join(r) for r in cells)
