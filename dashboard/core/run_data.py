"""Reading run directories for the UI: cached snapshots, safe lookups by name, and run files' time stamps.

The pages poll every second; re-parsing every JSONL file on every tick would tax a training run on the same
cores, so a snapshot is re-read only when one of the run's files changed size or mtime, and then only the
lines appended since the last read are parsed (run files are append-only; metrics.jsonl gains a line per
step, and re-reading thousands of lines per step for every watching page was the server's main cost with many
visitors). What a snapshot holds of metrics.jsonl, evals.jsonl and transcripts.jsonl is bounded whatever their
length (`dashboard.core.run_sample.RecordSample`: a spread of the file and its newest records; of transcripts, a
summary each, the one shown read from its line when asked): any visitor may open any run, and a 58 MB metrics
file was once sent whole to each. Names coming from the browser go through `resolve_run`, which refuses anything
that could leave the runs folder.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dashboard.access.inputs import MAX_NAME_CHARS, quote
from dashboard.core.run_sample import RecordSample
from training.run.directory import (InvalidRunName, RunDir, default_runs_root, live_status, read_line_at,
                                    redact_secrets, resolve_run)
from training.run.listing import list_runs
from training.run.results import Measured, final_measure, last_eval_measure

WATCHED = ("status.json", "config.json", "metrics.jsonl", "evals.jsonl", "transcripts.jsonl", "comparison.jsonl")
#: Transcripts listed per run (each a summary; the Run detail's picker): a spread over the run and the newest.
TRACES_SPREAD, TRACES_TAIL = 150, 50
#: The longest text a transcript summary keeps of a field (its outcome, its question id).
SUMMARY_CHARS = 200


def trace_summary(offset: int, record: dict[str, Any]) -> dict[str, Any]:
    """What a snapshot keeps of a transcripts.jsonl line: where it is, its step and what the picker shows; the
    transcript itself is read from its line when it is shown (`RunSnapshot.transcript`)."""
    transcript = record.get("transcript")
    words = transcript if isinstance(transcript, dict) else {}
    step = record.get("step")
    return {"offset": offset, "step": step if isinstance(step, (int, float)) and not isinstance(step, bool) else None,
            "time": record.get("time") if isinstance(record.get("time"), (int, float)) else None,
            "has_transcript": isinstance(transcript, dict),
            **{key: str(words.get(key, ""))[:SUMMARY_CHARS] for key in ("outcome", "question_id")}}


@dataclass
class RunSnapshot:
    run_id: str
    status: dict[str, Any]
    config: dict[str, Any] | None
    config_error: str | None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    transcripts: list[dict[str, Any]] = field(default_factory=list)
    comparison: list[dict[str, Any]] = field(default_factory=list)
    signature: tuple = ()
    raw_status: dict[str, Any] = field(default_factory=dict)  # status.json as written (status: as read, live)
    path: Path | None = None  # the run directory (where `transcript` reads a transcript's line)
    # Per JSONL kind: (its complete lines, whether that count is exact: a stretch read as a sample is estimated).
    line_counts: dict[str, tuple[int, bool]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return str(self.status.get("status", "unknown"))

    @property
    def pairs(self) -> list[dict[str, Any]]:
        return [r for r in self.comparison if isinstance(r, dict) and r.get("kind") == "pair"]

    @property
    def summary(self) -> dict[str, Any] | None:
        return next((r for r in reversed(self.comparison) if isinstance(r, dict) and r.get("kind") == "summary"), None)

    @property
    def t0(self) -> float | None:
        """When the run started (epoch seconds): the origin of its charts' timeline (None if unknown)."""
        started = parse_time(self.status.get("started_at")) or parse_time(self.status.get("created_at"))
        if started is not None:
            return started.timestamp()
        times = [r["time"] for r in self.metrics + self.evals
                 if isinstance(r, dict) and isinstance(r.get("time"), (int, float))]
        return min(times) if times else None

    @property
    def latest_transcript(self) -> dict[str, Any] | None:
        """The newest transcript's summary (`trace_summary`), or None."""
        return next((r for r in reversed(self.transcripts) if r.get("has_transcript")), None)

    def transcript(self, offset: Any) -> dict[str, Any] | None:
        """The transcripts.jsonl record of the summary at `offset` (one this snapshot lists: no other line is read),
        read from its line; None when it is not listed, or its file changed since (a resumed run rewrites it)."""
        listed = {r["offset"] for r in self.transcripts if r.get("has_transcript")}
        if isinstance(offset, bool) or not isinstance(offset, int) or offset not in listed or self.path is None:
            return None
        try:
            with open(self.path / "transcripts.jsonl", "rb") as f:
                start, record, _ = read_line_at(f, offset)
        except OSError:
            return None
        return record if start == offset and isinstance(record, dict) else None


def signature(path: Path) -> tuple:
    sig = []
    for name in WATCHED:
        try:
            st = (path / name).stat()
            sig.append((st.st_size, st.st_mtime_ns))
        except OSError:
            sig.append(None)
    return tuple(sig)


class RunCache:
    """Snapshots of runs keyed by id, refreshed only when the run's files changed."""

    def __init__(self, runs_root: Path | None = None):
        self.runs_root = Path(runs_root) if runs_root is not None else default_runs_root()
        self._cache: dict[str, RunSnapshot] = {}
        self._lock = threading.Lock()
        # (run path, kind) -> what is kept of each JSONL file read (bounded: `RecordSample`).
        self._samples: dict[tuple[str, str], RecordSample] = {}
        self._read_lock = threading.Lock()  # one reader per cache: a burst of pages reads a change once

    def resolve(self, name: str) -> RunDir:
        """The run called `name`, refusing names that leave the runs folder (InvalidRunName) or do not
        exist (FileNotFoundError)."""
        return resolve_run(name, self.runs_root)

    def snapshot(self, name: str) -> RunSnapshot:
        run = self.resolve(name)
        sig = signature(run.path)
        with self._lock:
            cached = self._cache.get(run.run_id)
            if cached is not None and cached.signature == sig:
                if cached.raw_status.get("status") in ("queued", "running"):
                    # Unchanged files say nothing about the writer: a dead process shows up as time passes.
                    cached.status = live_status(cached.raw_status)
                return cached
        with self._read_lock:
            return self._read_snapshot(run, sig)

    def _read_snapshot(self, run: RunDir, sig: tuple) -> RunSnapshot:
        with self._lock:
            cached = self._cache.get(run.run_id)
            if cached is not None and cached.signature == sig:  # another page read it while we waited
                return cached
        config, config_error = None, None
        try:
            # Every page shows a run's config to anyone: a secret, named like one or shaped like one (a run
            # written before TrainConfig refused them, or by hand), is redacted here, once for every reader.
            config = redact_secrets(run.read_config())
        except FileNotFoundError:
            config_error = "config.json not found"
        except (OSError, ValueError) as exc:
            config_error = f"config.json unreadable: {exc}"
        raw = run.read_status()
        snap = RunSnapshot(
            run_id=run.run_id,
            status=live_status(raw),  # a run whose process died reads "interrupted"
            raw_status=raw,
            config=config,
            config_error=config_error,
            metrics=self.read_jsonl(run, "metrics"),
            evals=self.read_jsonl(run, "evals"),
            transcripts=self.read_jsonl(run, "transcripts"),
            comparison=self.read_jsonl(run, "comparison"),
            signature=sig,
            path=run.path,
            line_counts={kind: self.line_count(run, kind) for kind in ("metrics", "evals", "transcripts")},
        )
        with self._lock:
            self._cache[run.run_id] = snap
        return snap

    @staticmethod
    def _new_sample(kind: str) -> RecordSample:
        if kind == "transcripts":
            return RecordSample(TRACES_SPREAD, TRACES_TAIL, keep=trace_summary)
        # comparison.jsonl is bounded by its writer (a pair per comparison episode, then a summary): read whole.
        return RecordSample(None) if kind == "comparison" else RecordSample()

    def read_jsonl(self, run: RunDir, kind: str) -> list[Any]:
        """The records kept of `<kind>.jsonl` (as `training.run.directory.read_records` reads them: a torn last line waits
        for its newline; a corrupt, overlong or too deep line is skipped), reading only the bytes appended since this
        cache last read the file: every record of comparison.jsonl; of metrics and evals the first and the newest
        and a bounded spread between (`RecordSample`); of transcripts, summaries (`trace_summary`). A file that shrank or was replaced is
        read again from its start. The list returned is new whenever records changed (snapshots already handed out
        never change)."""
        key = (str(run.path), kind)
        try:
            f = open(run.file(f"{kind}.jsonl"), "rb")
        except FileNotFoundError:
            self._samples.pop(key, None)
            return []
        with f:
            sample = self._samples.get(key) or self._samples.setdefault(key, self._new_sample(kind))
            sample.update(f)
        return sample.records

    def line_count(self, run: RunDir, kind: str) -> tuple[int, bool]:
        """(complete lines of `<kind>.jsonl` as last read, whether the count is exact: see `RecordSample`)."""
        sample = self._samples.get((str(run.path), kind))
        return (sample.lines, sample.exact) if sample is not None else (0, True)

    def try_snapshot(self, name: str | None) -> tuple[RunSnapshot | None, str | None]:
        """(snapshot, None) or (None, a message saying why the run cannot be shown)."""
        if not name:
            return None, "No run selected."
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:  # not echoed back whole
            return None, f"Refused: invalid run name {quote(name)}"
        try:
            return self.snapshot(name), None
        except InvalidRunName as exc:
            return None, f"Refused: {exc}"
        except FileNotFoundError:
            return None, f"No run named {name!r} under {self.runs_root.name}/."
        except OSError as exc:
            return None, f"Run {name!r} unreadable: {exc}"

    def measures(self, name: str) -> tuple[Measured | None, Measured | None]:
        """(headline, last periodic eval) of run `name` (see `final_measure`), from its cached snapshot when its
        files are unchanged, else reading only its config, evals and comparison (incrementally, as snapshots do):
        the Runs table asks this of every run and must not parse every run's metrics to fill one row."""
        run = self.resolve(name)
        with self._lock:
            cached = self._cache.get(run.run_id)
        if cached is not None and cached.signature == signature(run.path):
            config, evals, summary = cached.config, cached.evals, cached.summary
        else:
            try:
                config = run.read_config()
            except (OSError, ValueError):
                config = None
            with self._read_lock:
                evals = self.read_jsonl(run, "evals")
                comparison = self.read_jsonl(run, "comparison")
            summary = next((r for r in reversed(comparison) if isinstance(r, dict) and r.get("kind") == "summary"),
                           None)
        split = str((config if isinstance(config, dict) else {}).get("eval_split") or "eval")
        return final_measure(summary, evals, split), last_eval_measure(evals, split)

    def list(self) -> list[dict[str, Any]]:
        try:
            return list_runs(self.runs_root)
        except OSError:
            return []


def parse_time(value: Any) -> dt.datetime | None:
    """Run files stamp local ISO times (or epoch seconds); None when unparseable."""
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone().replace(tzinfo=None)
        return parsed
    return None
