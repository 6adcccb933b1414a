"""How far a run is and how long it has left: `progress` (step, total, elapsed, remaining) for the status bar and
the run detail, and the remaining time itself (`remaining_seconds`, `remaining_parts`).

A running run's remaining time is its current phase at its own pace, then the phases still to come at the measured
pace of the config measured for the same model and dataset (`dashboard.core.measured`, scaled by steps and
episodes), so the warm start and the evals are counted, not only GRPO.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dashboard.core.measured import measured
from dashboard.core.run_data import parse_time
from training.run.schema import PHASES

__all__ = ["PHASE_ORDER", "progress", "remaining_seconds", "remaining_parts"]

#: The phases of a run in the order they run, as status.json names them (`training.run.schema`).
PHASE_ORDER = list(PHASES)


def progress(status: dict[str, Any], now: dt.datetime | None = None,
             config: dict[str, Any] | None = None) -> dict[str, Any]:
    """step, total, elapsed and remaining seconds. Remaining, while running: the current phase at its own pace,
    then the later phases as measured for the run's model and dataset (`remaining_seconds`, so the warm start
    and the evals count); without a measurement, GRPO's steps at their own pace."""
    now = now or dt.datetime.now()
    step = status.get("step") if isinstance(status.get("step"), (int, float)) else 0
    total = status.get("total_steps") if isinstance(status.get("total_steps"), (int, float)) else None
    started = parse_time(status.get("started_at")) or parse_time(status.get("created_at"))
    ended = ("completed", "failed", "stopped", "interrupted")
    finished = parse_time(status.get("finished_at")) if status.get("status") in ended else None
    if status.get("status") == "interrupted":  # it died after its last heartbeat
        finished = parse_time(status.get("heartbeat_at"))
    elapsed = ((finished or now) - started).total_seconds() if started else None
    remaining = None
    if status.get("status") == "running":
        phase_started = parse_time(status.get("phase_started_at")) or parse_time(
            status.get({"sft": "sft_started_at", "grpo": "grpo_started_at"}.get(str(status.get("phase")), "")))
        in_phase = (now - phase_started).total_seconds() if phase_started else None
        remaining = remaining_seconds(status, config, in_phase)
    # Without a measurement: GRPO's steps at their own pace (model loading and SFT are not steps).
    grpo_started = parse_time(status.get("grpo_started_at")) or started
    if remaining is None and status.get("status") == "running" and grpo_started is not None and step and total:
        remaining = (now - grpo_started).total_seconds() / step * max(total - step, 0)
    elif status.get("status") in ended:
        remaining = 0.0
    return {"step": int(step), "total": int(total) if total else None, "elapsed": elapsed, "remaining": remaining}


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
