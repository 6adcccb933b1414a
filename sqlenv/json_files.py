"""JSON and JSONL files read with bounds: their size before anything is parsed, the length of each record, and
how deeply lists and objects nest.

The dashboard shows every run directory and saved evaluation under its runs folder to anyone, so one bad file
must cost one bounded read and read as unreadable, never more: a config nested 1,000,000 deep once raised
RecursionError (no ValueError) in the Runs and Compare tabs' load events and emptied their lists for everyone,
and a 50 MB config went whole to every page that opened it. Used by `training.run.directory` (run files) and
`sqlenv.evaluation.saved` (saved evaluations), with each file's own size bound. Standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["MAX_JSON_DEPTH", "parse_json", "read_json", "read_records"]

#: The deepest nesting of lists and objects read: run files and transcripts are 3 to 8 deep. Deeper JSON is
#: refused, so nothing that walks what was read (redaction, charts, a config diff) can run out of stack.
MAX_JSON_DEPTH = 64


def parse_json(data: bytes | str) -> Any:
    """`data` parsed as JSON; ValueError saying why when it is malformed or nested deeper than `MAX_JSON_DEPTH`
    (Python's parser gives up only at the interpreter's recursion limit, with a RecursionError, which is no
    ValueError; what it does parse is walked here without recursion)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= MAX_JSON_DEPTH:
                    raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
                stack.append((child, depth + 1))
    return value


def read_json(path: Path | str, max_bytes: int) -> Any:
    """The JSON file `path`, parsed by `parse_json`, of at most `max_bytes` (no more is read). Raises
    FileNotFoundError, OSError, or ValueError saying the file is too large or why it does not parse."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes:,} bytes")
    return parse_json(data)


def read_records(f: BinaryIO, max_record_bytes: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON object lines of a JSONL file from `f`'s position on: (records, bytes read up to the end of the last
    complete line, where the next read starts).

    A torn last line (no newline yet: its writer is mid-append) is left for the next read. A line that does not
    parse, one that is no object, one nested too deep and one over `max_record_bytes` (read no further than its
    end, in pieces of that size) are skipped, and the lines after them read."""
    records: list[dict[str, Any]] = []
    consumed = 0
    while True:
        line = f.readline(max_record_bytes + 1)
        if not line.endswith(b"\n"):
            if len(line) <= max_record_bytes:
                return records, consumed  # the end of the file, or a torn last line
            skipped = len(line)  # an overlong line: skip to its end without holding it
            while not line.endswith(b"\n"):
                line = f.readline(max_record_bytes)
                if not line:
                    return records, consumed  # its end is not written yet
                skipped += len(line)
            consumed += skipped
            continue
        consumed += len(line)
        try:
            record = parse_json(line.decode("utf-8", errors="replace"))
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
