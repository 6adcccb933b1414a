"""What each config reached and cost, as measured: `configs/measured.json`, read by the Train form's cost line
(`dashboard.train.cost_line`) and the remaining-time estimate (`dashboard.core.progress`), written by the benches.

`configs/measured.json` holds, per config file, what one run of it reached and cost on a named machine: eval
success at each stage (random policy, zero-shot, warm start, after GRPO) on how many eval questions, minutes all-in,
peak memory, disk written, seconds per phase, the steps and eval episodes it ran, the command that measured it, a
digest of the config's content, and the machine's load before and during the run (`shared`: other work shared the
cores, so the minutes are longer than a newcomer's idle machine gives; the cost line says so). The bench that
measured a config writes its entry (`record`): `python bench/learning/learning_curve.py --record` for the default run
(configs/tiny_cpu.json), `python bench/learning/real_model.py --config configs/X.json --record` for any config; both
refuse to start while other work loads the machine, unless told `--shared`. The picker shows it before Start, and says
so when the config changed since (its digest differs).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any

from dashboard.core.paths import CONFIGS_DIR
from training.run.directory import atomic_write_json

__all__ = ["MEASURED_FILE", "measured", "config_digest", "record"]

MEASURED_FILE = CONFIGS_DIR / "measured.json"


def measured(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """config file name -> its measurement (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(Path(path or MEASURED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def config_digest(config_file: Path | str) -> str | None:
    """A short SHA-256 of a config file's JSON content (keys sorted, whitespace dropped, so re-indenting the file
    keeps it), or None when the file is missing or not JSON. A measurement stores the digest of the config it ran;
    the cost line compares it with the file as it is now."""
    try:
        content = json.loads(Path(config_file).read_text())
    except (OSError, ValueError):
        return None
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def record(config_file: Path | str, entry: dict[str, Any], digest: str | None = None, path: Path | None = None) -> Path:
    """Keep a bench's measurement of `config_file` in `configs/measured.json` under the file's name, with the
    digest of the config it ran (`config_sha256`) and today's date; other configs' entries are kept.

    Args:
        config_file: a config under `configs/` (the picker looks entries up by file name in that folder).
        entry: the figures (see the module docstring), including `command`, the command line that measured them.
        digest: `config_digest` of the file when the run started (default: as it is now; a bench passes the one it
            took before training, so an edit during the run is not credited with its figures).
        path: the table to write (default `MEASURED_FILE`; tests pass their own).
    """
    config_file = Path(config_file)
    path = Path(path or MEASURED_FILE)
    table = measured(path)
    table[config_file.name] = {**entry, "config_sha256": digest or config_digest(config_file),
                               "date": datetime.date.today().isoformat()}
    atomic_write_json(path, table)
    return path
