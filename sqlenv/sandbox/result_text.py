"""Observation text of the SQL sandbox: result tables, cells and excerpts, each cut to a bounded length.

Every function here does work bounded by its limits, whatever the size of what it is given: an agent's argument
of many megabytes is shown as a short, printable excerpt.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

TRUNCATION_MARKER = " …[truncated]"


def clean_for_display(text: str, limit: int = 200) -> str:
    """A printable, valid-UTF-8 one-line excerpt of any argument (NULs and lone surrogates replaced)."""
    text = text[: limit * 4]  # bounded work whatever the argument's size
    text = text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\0")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    shown = rows[:max_rows]
    if len(columns) == 1 and shown:  # one column of ints and short one-line strings (the most common result): in C
        cells = list(map(str, map(itemgetter(0), shown)))
        text = "\n".join(cells)
        if _PLAIN_TYPES.issuperset(map(type, map(itemgetter(0), shown))) and max(map(len, cells)) <= max_cell_chars \
                and text.count("\n") == len(cells) - 1 and "\r" not in text and "\x00" not in text:
            lines.append(text)
            shown = ()
    for row in shown:
        # Fast path (C-level joins) for rows of ints and short single-line strings, the common case.
        if _PLAIN_TYPES.issuperset(map(type, row)):
            line = " | ".join(map(str, row))
            if (len(line) <= max_cell_chars or max(map(len, map(str, row))) <= max_cell_chars) \
                    and "\n" not in line and "\r" not in line and "\x00" not in line:
                lines.append(line)
                continue
        lines.append(" | ".join([v if type(v) is str and len(v) <= max_cell_chars and v.isprintable() else
                                 format_value(v, max_cell_chars) for v in row]))
    n_shown = min(len(rows), max_rows)
    if n_total > n_shown:
        more = n_total - n_shown
        lines.append(f"({more}{'+' if approximate else ''} more rows)")
    if n_total == 0:
        lines.append("(0 rows)")
    return "\n".join(lines)


def cut_text(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, ending with a visible marker when it was cut."""
    if len(text) <= max_chars:
        return text
    return text[: max(0, max_chars - len(TRUNCATION_MARKER))] + TRUNCATION_MARKER
