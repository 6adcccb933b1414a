"""A bounded sample of a growing run file: what the pages keep and chart of a JSONL file of any length.

The run cache (`dashboard.core.run_data`) kept every record of a run's files and every chart drew every one: an honest
long run that logs each step wrote a 58 MB `metrics.jsonl` of 400,000 lines, and each anonymous Run detail view took
6 s and a 41.6 MB reply (six at once: 17-26 s each, the app 314 -> 1,065 MB; issue 49, finding 6). A
`RecordSample` keeps the file's first `head` records and its last `tail` whole, and at most `spread` records spread
evenly between (the first of each of `spread` equal byte ranges), as TensorBoard keeps ~1,000 points of a scalar
series: every chart series has at most `head + spread + tail` points however long the run, and what reads a run's
start or its newest steps (`training.run.health`'s rules, the status bar) reads them whole.

Each `update` reads what the file gained since the last one. Up to `parse_bytes` of it are parsed line by line
(a live run's new lines: the common case); a longer stretch, such as a long file read for the first time, is not:
one line is read at each of the spread's range starts within it (`training.run.directory.read_line_at`) and its last
`parse_bytes` are parsed whole. An update's work is bounded by those numbers, never by the file's size, and the
lines counted in a stretch that was sampled are estimated from the lines read (`exact` says so).
"""

from __future__ import annotations

import math
import os
from typing import Any, BinaryIO, Callable

from training.run.directory import read_line_at

__all__ = ["RecordSample", "HEAD", "SPREAD", "TAIL", "PARSE_BYTES"]

#: A file's first records and its newest kept whole, and the records kept spread between: at most
#: HEAD + SPREAD + TAIL points a series.
HEAD, SPREAD, TAIL = 32, 750, 250
#: The most bytes one update parses line by line (a longer stretch is sampled, its last PARSE_BYTES parsed).
PARSE_BYTES = 512 * 1024


class RecordSample:
    """The records kept of one append-only JSONL file (`records`, in file order), read a stretch at a time.

    Args:
        spread: records kept spread over the whole file (None: every record, for files bounded by their writer).
        tail: the newest records kept whole.
        head: the file's first records kept whole (those of its first `head` lines).
        parse_bytes: the most bytes an update parses line by line.
        keep: what is kept of a record, given its byte offset and the record (default: the record itself).
    """

    def __init__(self, spread: int | None = SPREAD, tail: int = TAIL, parse_bytes: int = PARSE_BYTES,
                 keep: Callable[[int, dict[str, Any]], Any] | None = None, head: int = HEAD):
        self.spread, self.tail, self.parse_bytes, self.head = spread, tail, parse_bytes, head
        self.keep = keep or (lambda _offset, record: record)
        self._reset(None)

    def _reset(self, inode: int | None) -> None:
        self.inode = inode
        self.end = 0  # where the next update starts: the end of the last complete line read
        self.lines = 0  # complete lines up to `end` (estimated where a stretch was sampled)
        self.exact = True  # every line up to `end` was read
        self._entries: list[tuple[int, Any]] = []  # (offset, kept) in file order
        self._head_entries = 0  # how many of them come from the first `head` lines (never thinned)
        self.records: list[Any] = []  # a new list whenever the kept records change

    def update(self, f: BinaryIO) -> bool:
        """Read what the file `f` (opened binary) gained since the last update; True when `records` changed. A file
        replaced (another inode) or shorter than what was read is read again from its start."""
        st = os.fstat(f.fileno())
        if st.st_ino != self.inode or st.st_size < self.end:
            changed = bool(self._entries) or self.inode is not None
            self._reset(st.st_ino)
        else:
            changed = False
        size = st.st_size
        if size == self.end:
            return changed
        added: list[tuple[int, Any]] = []
        start = self.end
        if self.spread is not None:
            if self.lines < self.head:  # the first lines whole (a stretch is sampled only after them)
                start = self._parse(f, start, added, self.head - self.lines)
            if size - start > self.parse_bytes:
                start = self._sample(f, start, size - self.parse_bytes, size, added)
        self._parse(f, start, added)
        if not added:
            return changed
        entries = self._entries + added
        first = self._head_entries
        if self.spread is not None and len(entries) > first + self.spread + self.tail:
            entries = entries[:first] + self._thinned(entries[first:-self.tail], self.end) + entries[-self.tail:]
        self._entries = entries
        self.records = [kept for _, kept in entries]
        return True

    def _sample(self, f: BinaryIO, start: int, tail_from: int, size: int, added: list) -> int:
        """One line at each range start of the spread in [start, tail_from): added to `added`, their lines
        estimated. Returns where the whole lines start (the first line at or after `tail_from`)."""
        cell = size / self.spread
        offsets = [start] + [int(k * cell) for k in range(math.ceil(start / cell) or 1, math.ceil(tail_from / cell))]
        read_bytes = read_lines = 0
        after = start
        for offset in offsets:
            if offset < after:  # inside the line just read
                continue
            line_start, record, after = read_line_at(f, offset)
            if after is None or line_start >= tail_from:
                break
            read_bytes, read_lines = read_bytes + after - line_start, read_lines + 1
            if record is not None:
                added.append((line_start, self.keep(line_start, record)))
        tail_start, _, _ = read_line_at(f, tail_from)
        if read_lines:
            self.lines += round((tail_start - start) * read_lines / read_bytes)
            self.exact = False
        self.end = tail_start
        return tail_start

    def _parse(self, f: BinaryIO, start: int, added: list, most: float = math.inf) -> int:
        """Every complete line from `start` on, or its first `most` lines (a torn last line waits for the next
        update); returns where reading stopped."""
        position, read = start, 0
        while read < most:
            line_start, record, after = read_line_at(f, position)
            if after is None:
                break
            if record is not None:
                added.append((line_start, self.keep(line_start, record)))
                self._head_entries += self.lines < self.head
            self.lines += 1
            read += 1
            position = after
        self.end = position
        return position

    def _thinned(self, entries: list[tuple[int, Any]], size: int) -> list[tuple[int, Any]]:
        """The first entry of each of `spread` equal byte ranges of a file of `size` bytes."""
        cell = max(size, 1) / self.spread
        kept, last = [], -1
        for offset, value in entries:
            index = int(offset / cell)
            if index != last:
                kept.append((offset, value))
                last = index
        return kept

    @property
    def offsets(self) -> list[int]:
        """The byte offsets of the kept records' lines, in file order."""
        return [offset for offset, _ in self._entries]
