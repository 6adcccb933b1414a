"""What a config costs, as measured, and how long a run has left: the Train tab's cost line and remaining time.

`configs/measured.json` holds, per config file, what one run of it cost on a named machine — minutes all-in, peak
memory, disk written, seconds per phase, and the steps and eval episodes it ran — written by
`python bench/real_model.py --config configs/X.json --record` (or by hand from another bench, saying which).
The picker shows it before Start; a running run's remaining time is its current phase at its own pace, then
the phases still to come at the measured pace of the config measured for the same model and dataset (scaled by
steps and episodes), so the warm start and the evals are counted, not only GRPO.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

__all__ = ["MEASURED_FILE", "measured", "cost_html", "remaining_seconds", "remaining_parts", "PHASE_ORDER"]

MEASURED_FILE = Path(__file__).resolve().parent.parent / "configs" / "measured.json"

#: The phases of a run in the order they run (`training.phases`), as status.json names them.
PHASE_ORDER = ["loading model", "zero-shot eval", "sft", "base eval", "grpo", "saving", "comparison"]


def measured(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """config file name -> its measurement (empty when the file is missing or unreadable)."""
    try:
        data = json.loads(Path(path or MEASURED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def cost_html(config_file: Path | str | None, table: dict[str, dict[str, Any]] | None = None) -> str:
    """One line for the Train form: which config the form holds and what it cost when measured."""
    if config_file is None:
        return '<div class="sqe-muted" id="train-config-cost">No config file: the form\'s own values.</div>'
    path = Path(config_file)
    name = path.name
    entry = (measured() if table is None else table).get(name) if path.parent.resolve() == MEASURED_FILE.parent else None
    try:
        shown = str(path.resolve().relative_to(MEASURED_FILE.parent.parent))
    except ValueError:  # a config from elsewhere (`python app.py --config`): its own path
        shown = str(path)
    loaded = f"Loaded <code>{html.escape(shown)}</code>"
    if not entry:
        return f'<div class="sqe-muted" id="train-config-cost">{loaded} · not measured yet.</div>'
    parts = []
    if isinstance(entry.get("minutes"), (int, float)):
        parts.append(f"<b>~{entry['minutes']:.0f} min</b> all-in")
    if isinstance(entry.get("peak_memory_gb"), (int, float)):
        parts.append(f"peak memory <b>{entry['peak_memory_gb']:.1f} GiB</b>")
    if isinstance(entry.get("disk_written_gb"), (int, float)):
        parts.append(f"{entry['disk_written_gb']:.1f} GiB written")
    machine = html.escape(str(entry.get("machine") or "one machine"))
    return (f'<div class="sqe-muted" id="train-config-cost" data-minutes="{entry.get("minutes", "")}">{loaded} · '
            f'measured on {machine}: {", ".join(parts) or "no figures"}</div>')


def _scale(entry: dict[str, Any], phase: str, config: dict[str, Any]) -> float | None:
    """The measured seconds of `phase`, scaled to `config`'s steps or episodes."""
    seconds = (entry.get("phase_seconds") or {}).get(phase)
    if not isinstance(seconds, (int, float)):
        return None
    sft = config.get("sft") if isinstance(config.get("sft"), dict) else {}
    ratios = {
        "sft": (sft.get("max_steps"), entry.get("sft_steps")),
        "grpo": (_grpo_episodes(config), entry.get("grpo_episodes")),
        "comparison": (config.get("comparison_episodes"), entry.get("comparison_episodes")),
        "base eval": (config.get("comparison_episodes"), entry.get("comparison_episodes")),
    }
    now, then = ratios.get(phase, (None, None))
    if isinstance(now, (int, float)) and isinstance(then, (int, float)) and now > 0 and then > 0:
        seconds *= now / then
    return float(seconds)


def _grpo_episodes(config: dict[str, Any]) -> int | None:
    try:
        return int(config["max_steps"]) * int(config["per_device_train_batch_size"]) * int(
            config.get("gradient_accumulation_steps") or 1)
    except (KeyError, TypeError, ValueError):
        return None


def _entry_for(config: dict[str, Any], table: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    for entry in table.values():
        if entry.get("model") == config.get("model") and entry.get("dataset") == config.get("dataset"):
            return entry
    return None


def remaining_seconds(status: dict[str, Any], config: dict[str, Any] | None, elapsed_in_phase: float | None,
                      table: dict[str, dict[str, Any]] | None = None) -> float | None:
    """Seconds a running run has left: the current phase at its own pace (its steps so far), else as measured;
    plus every later phase as measured for the same model and dataset. None when nothing is known yet."""
    parts = remaining_parts(status, config, elapsed_in_phase, table)
    if parts is None or parts["current"] is None:
        return None
    if not parts["measured"]:
        return parts["current"]
    return parts["current"] + parts["later"]


def remaining_parts(status: dict[str, Any], config: dict[str, Any] | None, elapsed_in_phase: float | None,
                    table: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """What `remaining_seconds` adds up, for a status bar that says what it knows: {"current": seconds the current
    phase has left (None until its pace or a measurement says), "later": seconds of the later phases as measured
    (0.0 without a measurement), "measured": whether a measurement of this model and dataset exists}. None for a
    phase outside `PHASE_ORDER` (queued, done)."""
    config = config or {}
    phase = status.get("phase")
    if phase not in PHASE_ORDER:
        return None
    entry = _entry_for(config, measured() if table is None else table)
    current = None
    if phase == "sft":
        done, total = status.get("phase_step"), status.get("phase_total")
    elif phase == "grpo":
        done, total = status.get("step"), status.get("total_steps")
    else:
        done = total = None
    if isinstance(done, int) and isinstance(total, int) and done > 0 and elapsed_in_phase is not None:
        current = elapsed_in_phase / done * max(total - done, 0)
    elif entry is not None:
        planned = _scale(entry, phase, config)
        if planned is not None:
            current = max(planned - (elapsed_in_phase or 0.0), 0.0)
    later = 0.0
    if entry is not None:
        rest = [_scale(entry, p, config) for p in PHASE_ORDER[PHASE_ORDER.index(phase) + 1:]]
        later = sum(s for s in rest if s is not None)
    return {"current": current, "later": later, "measured": entry is not None}
