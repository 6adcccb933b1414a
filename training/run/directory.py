"""The run directory: the one on-disk format that the CLI, the notebook and the dashboard share.

Layout of ``runs/<run_id>/``::

    config.json        the TrainConfig as JSON (resolved: what the run used)
    status.json        status (queued/running/completed/failed/stopped), error, timestamps, step, total_steps,
                       phase (the one running) and phases (the run's plan: [{"name", "label"}], in order), and
                       who writes it: pid, host, heartbeat_at (see `live_status`: a dead writer reads
                       `interrupted`)
    metrics.jsonl      one line per TRL log (plus "step" and "time")
    evals.jsonl        {"step", "split", "success_rate", "avg_reward", "avg_steps", "n_episodes", "time",
                       "execution_accuracy", "breakdown": sqlenv.evaluation.breakdown cells
                       (runs before EX lack the last two)}; an eval that raised: {"step", "split", "error", "time"}
    transcripts.jsonl  {"step", "time", "transcript": <sqlenv transcript>}
    comparison.jsonl   {"kind": "pair", ...} lines, then one {"kind": "summary", ...}; each holds "random",
                       "trained", "base" (the model before GRPO) and, for a warm-started pretrained model,
                       "zero_shot" (the model before any training); the summary's scores carry success_ci,
                       execution_accuracy, execution_ci and breakdown since EX exists; a comparison that raised
                       writes {"kind": "error", "error"} instead, and the run fails with it
    zero_shot.json     {"episodes": [...]}: that zero-shot eval, kept for a resumed run's comparison
    grpo_config.json   the effective trl.GRPOConfig (sft_config.json: the warm start's SFTConfig)
    checkpoints/       sft/ and grpo/checkpoint-<step>/: resumable trainer state (removed once the run completes)
    warm_start/        the model as SFT left it, when SFT ran (GRPO's start, its KL reference, LoRA's base)
    base_model/        a plain copy of a GGUF model, when GRPO needs a KL reference without a warm start (TRL loads
                       the reference with from_pretrained, which cannot read GGUF)
    tracker/           file-based trackers' logs (TensorBoard), when report_to asks for them
    final/             model + tokenizer, or with LoRA the adapter (adapter_config.json) and, on request, merged/

JSON files are replaced atomically; JSONL lines are appended whole and flushed, and readers skip a torn
last line, so a reader never crashes on a run that is being written. Every read is bounded (`sqlenv.json_files`),
because the dashboard shows any run directory to anyone: a JSON file over `MAX_JSON_BYTES`, a JSONL line over
`MAX_RECORD_BYTES` and JSON nested deeper than `sqlenv.json_files.MAX_JSON_DEPTH` read as unreadable. No torch
import here.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqlenv import json_files
# The run record's names and its secret rules, importable from here too: this module is the run directory's API.
from training.run.schema import (FINISHED_STATUSES, INTERRUPTED, JSONL_FILES, RESUMABLE_STATUSES, RUN_ID_PATTERN,
                                 STATUSES, default_runs_root, new_run_id)
from training.run.secrets import REDACTED, is_secret_name, is_secret_value, redact_secrets, secret_paths

__all__ = [
    "STATUSES", "FINISHED_STATUSES", "INTERRUPTED", "RESUMABLE_STATUSES", "RUN_ID_PATTERN", "JSONL_FILES",
    "HEARTBEAT_SECONDS", "HEARTBEAT_TIMEOUT", "MAX_JSON_BYTES", "MAX_RECORD_BYTES", "REDACTED", "is_secret_name",
    "is_secret_value", "secret_paths", "redact_secrets", "default_runs_root", "new_run_id", "now_iso",
    "atomic_write_json", "read_json", "append_jsonl", "read_records", "read_jsonl", "read_line_at", "this_host",
    "live_status", "last_checkpoint", "InvalidRunName", "RunDir", "resolve_run",
]

#: Seconds between heartbeats of a live run, and the silence after which a run on another host counts as dead.
HEARTBEAT_SECONDS = 10.0
HEARTBEAT_TIMEOUT = 90.0
#: The largest config.json or status.json read (bytes): a resolved TrainConfig is ~3 KB, its TRL passthrough a few
#: more; a larger file reads as unreadable (it is never parsed, nor sent to a page).
MAX_JSON_BYTES = 256 * 1024
#: The largest JSONL record read (bytes): a transcript line of a 100-step episode of bounded observations is well
#: under it; a longer line is skipped as a corrupt one is (the lines after it are read).
MAX_RECORD_BYTES = 4 * 1024 * 1024


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write JSON to a temp file in the same folder, then rename it over `path` (never half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, default=_json_default)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """A run's JSON file (config.json, status.json): `sqlenv.json_files.read_json`, at most `MAX_JSON_BYTES`."""
    return json_files.read_json(path, MAX_JSON_BYTES)


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one whole line and flush it, so concurrent readers see complete lines or a torn last one."""
    line = json.dumps(obj, default=_json_default, allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


def read_records(f: BinaryIO) -> tuple[list[dict[str, Any]], int]:
    """The records of a run's JSONL file from `f`'s position on, and the bytes read up to the end of the last
    complete line (`sqlenv.json_files.read_records`, lines of at most `MAX_RECORD_BYTES`): the one reader of JSONL
    run files, for `read_jsonl` and the dashboard's incremental reads."""
    return json_files.read_records(f, MAX_RECORD_BYTES)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of `path` (`read_records`: a torn, corrupt, overlong or too deep line is
    skipped);
    a missing file reads as []."""
    try:
        with open(path, "rb") as f:
            return read_records(f)[0]
    except FileNotFoundError:
        return []


def read_line_at(f: BinaryIO, offset: int) -> tuple[int, dict[str, Any] | None, int | None]:
    """The JSONL line of `f` that starts at byte `offset`, or the next one when `offset` falls inside a line: (where
    it starts, its record or None when the line is no readable record (`read_records`' rules), where the next line
    starts, or None when no complete line starts there: the end, or a torn last line). Reads that one line at most,
    in pieces of `MAX_RECORD_BYTES`: what a bounded reader of a long run file (a sample spread over it) reads."""
    f.seek(max(0, offset - 1))
    if offset > 0 and f.read(1) != b"\n":  # inside a line: its end first
        while not (piece := f.readline(MAX_RECORD_BYTES)).endswith(b"\n"):
            if not piece:
                return f.tell(), None, None
    start = f.tell()
    line = f.readline(MAX_RECORD_BYTES + 1)
    if not line.endswith(b"\n"):
        if len(line) <= MAX_RECORD_BYTES:
            return start, None, None
        while not (line := f.readline(MAX_RECORD_BYTES)).endswith(b"\n"):  # an overlong line, skipped
            if not line:
                return start, None, None
        return start, None, f.tell()
    records, _ = read_records(io.BytesIO(line))
    return start, (records[0] if records else None), f.tell()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float):
        return None
    return str(obj)


def _finite(obj: Any) -> Any:
    """NaN/inf are not JSON: replace them with None, recursively."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    except OSError:
        return False
    return True


def this_host() -> str:
    import socket

    return socket.gethostname()


def live_status(status: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """`status` as a reader should see it: a queued or running run whose writer is gone reads `interrupted`.

    The writer is gone when its process no longer exists (same host: `pid` is checked), or when its heartbeat
    (`heartbeat_at`, epoch seconds, refreshed every `HEARTBEAT_SECONDS` while the run is alive) is older than
    `HEARTBEAT_TIMEOUT` (any host: also covers a reused pid after a reboot). Runs written before heartbeats existed
    (no `pid`) are left as they are. The file itself is not changed.
    """
    if status.get("status") not in ("queued", "running") or not isinstance(status.get("pid"), int):
        return status
    now = time.time() if now is None else now
    beat = status.get("heartbeat_at")
    stale = isinstance(beat, (int, float)) and now - beat > HEARTBEAT_TIMEOUT
    dead = status.get("host") == this_host() and not _pid_alive(status["pid"])
    if not (stale or dead):
        return status
    why = "its process is gone" if dead else f"no heartbeat for {int(now - beat)} s"
    return {**status, "status": INTERRUPTED, "interrupted_reason": why,
            "error": status.get("error") or f"interrupted: {why} (kill, out of memory, reboot?); "
                                             f"resume with python -m training.train --resume <run dir>"}


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete `checkpoint-<step>` in `folder` (one with its trainer_state.json), or None."""
    best: tuple[int, Path] | None = None
    if not Path(folder).is_dir():
        return None
    for child in Path(folder).iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", child.name)
        if m and (child / "trainer_state.json").exists():
            if best is None or int(m.group(1)) > best[0]:
                best = (int(m.group(1)), child)
    return best[1] if best else None



class InvalidRunName(ValueError):
    pass


@dataclass
class RunDir:
    """Reads and writes one run directory. Writers: the training callback (main process only)."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, root: Path | None = None, run_id: str | None = None) -> "RunDir":
        root = Path(root) if root is not None else default_runs_root()
        run_id = run_id or new_run_id()
        if not RUN_ID_PATTERN.match(run_id):
            raise InvalidRunName(f"invalid run id {run_id!r}: use letters, digits, '.', '_' and '-'")
        run = cls(root / run_id)
        run.path.mkdir(parents=True, exist_ok=True)
        return run

    # --- files -------------------------------------------------------------------------------------
    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def final_dir(self) -> Path:
        return self.path / "final"

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_json(self.file("config.json"), _finite(config))

    def read_config(self) -> dict[str, Any]:
        """config.json (`read_json`'s bounds); ValueError when it is unreadable or not a JSON object."""
        config = read_json(self.file("config.json"))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        return config

    def write_status(self, status: str | None = None, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into status.json (atomically) and stamp updated_at; a new `phase` stamps
        `phase_started_at` (what the dashboard's remaining time counts the phase's pace from)."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {STATUSES}")
        current = self.read_status(default={})
        if status is not None:
            current["status"] = status
        if "phase" in fields and fields["phase"] != current.get("phase"):
            current["phase_started_at"] = now_iso()
        current.update(fields)
        current.setdefault("run_id", self.run_id)
        current["updated_at"] = now_iso()
        atomic_write_json(self.file("status.json"), _finite(current))
        return current

    def read_status(self, default: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            data = read_json(self.file("status.json"))
            if not isinstance(data, dict):
                raise ValueError("status.json is not an object")
            return data
        except FileNotFoundError:
            if default is not None:
                return dict(default)
            return {"run_id": self.run_id, "status": "missing", "error": "status.json not found"}
        except (ValueError, OSError) as exc:
            if default is not None:
                return dict(default)
            return {"run_id": self.run_id, "status": "corrupt", "error": f"status.json unreadable: {exc}"}

    def append(self, kind: str, record: dict[str, Any]) -> None:
        """Append a record to `<kind>.jsonl` (kind in metrics/evals/transcripts/comparison)."""
        if kind not in JSONL_FILES:
            raise ValueError(f"unknown JSONL file {kind!r}")
        append_jsonl(self.file(f"{kind}.jsonl"), _finite(record))

    def read_live_status(self) -> dict[str, Any]:
        """status.json as a reader should see it (`live_status`: a dead writer's run reads `interrupted`)."""
        return live_status(self.read_status())

    def truncate(self, kind: str, keep: Any) -> int:
        """Rewrite `<kind>.jsonl` (atomically) with only the records `keep(record)` accepts; returns how many were
        dropped. Resume uses it so that steps replayed after a checkpoint are not recorded twice."""
        records = self.read(kind)
        kept = [r for r in records if keep(r)]
        if len(kept) == len(records):
            return 0
        path = self.file(f"{kind}.jsonl")
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in kept:
                f.write(json.dumps(record, default=_json_default, allow_nan=False) + "\n")
        os.replace(tmp, path)
        return len(records) - len(kept)

    def read(self, kind: str) -> list[dict[str, Any]]:
        if kind not in JSONL_FILES:
            raise ValueError(f"unknown JSONL file {kind!r}")
        return read_jsonl(self.file(f"{kind}.jsonl"))

    def final_tmp_dir(self) -> Path:
        """A fresh temp folder beside final/; pass it to `commit_final` once everything is saved in it."""
        return Path(tempfile.mkdtemp(dir=self.path, prefix=".final-"))

    def commit_final(self, tmp_dir: Path) -> Path:
        """Swap a completely written temp folder in as final/ (the old final/ is removed)."""
        import shutil

        if self.final_dir.exists():
            old = self.path / f".final-old-{os.urandom(3).hex()}"
            os.replace(self.final_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp_dir, self.final_dir)
        return self.final_dir


def resolve_run(name: str, root: Path | None = None) -> RunDir:
    """The run called `name` under `root`: the one containment check every reader of the runs folder goes
    through (the dashboard's pages, `list_runs`, resume). Names that could leave `root` ('..', '/', absolute) are
    refused, and so is a run directory that is a symlink leading out of `root`."""
    root = Path(root) if root is not None else default_runs_root()
    if not isinstance(name, str) or not RUN_ID_PATTERN.match(name) or name in (".", ".."):
        raise InvalidRunName(f"invalid run name {name!r}")
    path = (root / name).resolve()
    if path.parent != root.resolve():
        raise InvalidRunName(f"run name {name!r} is outside {root}")
    if not path.is_dir():
        raise FileNotFoundError(f"no run named {name!r} under {root}")
    return RunDir(path)
