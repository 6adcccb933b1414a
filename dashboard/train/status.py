"""The Train tab's status bar: the run, its phases in a row (done, current, where it ended), the current phase's
progress and the remaining time, as one HTML block (`#train-status`) whose data-* attributes the browser tests and
the latency benchmark read.

Built from a `RunSnapshot` (the run's files) alone, so a reload or a second browser shows the same bar.
"""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from dashboard.core import charts
from dashboard.core.formatting import duration
from dashboard.core.progress import PHASE_ORDER, progress, remaining_parts
from dashboard.core.run_data import RunSnapshot, parse_time
from dashboard.train.gpu import readout_html
from training.run.health import collapse_signs
from training.run.schema import BASE_EVAL, COMPARISON, GRPO, LOADING_MODEL, SAVING, SFT, ZERO_SHOT_EVAL

__all__ = ["PHASE_LABELS", "ENDED", "planned_phases", "phase_slot", "ended_in", "phase_strip_html", "remaining_text",
           "health_html", "status_html"]

#: What the status bar calls each `phase` of status.json: the run's phases (`training.run.schema`; "saving" ends
#: GRPO), and the states around them.
PHASE_LABELS = {"queued": "queued", "starting": "starting", LOADING_MODEL: "loading the model",
                ZERO_SHOT_EVAL: "zero-shot eval", SFT: "warm start (SFT)", BASE_EVAL: "base eval", GRPO: "GRPO",
                SAVING: "saving the model", COMPARISON: "final eval", "done": "done"}
ENDED = ("completed", "stopped", "failed", "interrupted")


def planned_phases(status: dict[str, Any] | None, current: str | None = None) -> list[tuple[str, str]]:
    """(status.json phase, label) of the phases the run plays, in order, as the run recorded its plan
    (`phases` in status.json, written by `training.phases.planned_phases` when it starts; none before, nor in runs
    older than it); the `current` phase is always among them (a run whose plan reads otherwise still shows where
    it is)."""
    recorded = (status or {}).get("phases")
    phases = []
    for phase in recorded if isinstance(recorded, list) else []:
        if isinstance(phase, dict) and "name" in phase and "label" in phase:
            phases.append((str(phase["name"]), str(phase["label"])))
    if current in PHASE_ORDER and current != "saving" and current not in dict(phases):
        order = PHASE_ORDER.index(current)
        at = next((i for i, (name, _) in enumerate(phases)
                   if name in PHASE_ORDER and PHASE_ORDER.index(name) > order), len(phases))
        phases.insert(at, (current, PHASE_LABELS[current]))
    return phases


def phase_slot(phase: Any) -> Any:
    """The planned phase a status.json `phase` belongs to: saving the model closes GRPO."""
    return "grpo" if phase == "saving" else phase


def ended_in(status: dict[str, Any], names: list[str]) -> str | None:
    """The phase a run that did not complete (stopped, failed, interrupted) ended in: the one its status.json still
    names, else (a stopped or failed run says "done" / "failed") the last of `names` that left a start stamp."""
    phase = phase_slot(status.get("phase"))
    if phase in names:
        return phase
    stamps = {"sft": "sft_started_at", "grpo": "grpo_started_at"}
    started = [name for name in names if name in stamps and status.get(stamps[name])]
    return started[-1] if started else (names[0] if names else None)


def phase_strip_html(phases: list[tuple[str, str]], status: dict[str, Any], state: str) -> str:
    """The run's phases in a row (`#train-phases`, each phase a `[data-phase]` span whose `data-state` is done /
    current / ended / todo): those done ticked, the one running in bold; a run that did not complete marks the
    phase it ended in ("stopped", "failed") and leaves the later ones unticked."""
    names = [name for name, _ in phases]
    current = str(status.get("phase") or "")
    if state == "completed":
        at = len(names)
    elif state in ENDED:
        at = names.index(ended_in(status, names)) if names else -1
    else:
        slot = phase_slot(current)
        at = names.index(slot) if slot in names else -1
    # A run stopped in GRPO still plays its (short) final eval.
    final_after_stop = state == "stopped" and 0 <= at < len(names) and names[at] == "grpo"
    styles = {"done": "color:#64748b", "current": "font-weight:600;color:#4338ca", "todo": "color:#94a3b8",
              "ended": "font-weight:600;color:#b45309"}
    spans = []
    for i, (name, label) in enumerate(phases):
        if i < at or (final_after_stop and name == "comparison"):
            which, text = "done", f"✓ {label}"
        elif i == at:
            which, text = ("ended", f"{label}: {state}") if state in ENDED else ("current", label)
        else:
            which, text = "todo", label
        spans.append(f'<span class="sqe-phase" data-phase="{html.escape(name)}" data-state="{which}" '
                     f'style="{styles[which]}">{html.escape(text)}</span>')
    return f'<div id="train-phases" class="sqe-phases" style="font-size:0.9em">{" › ".join(spans)}</div>' if spans else ""


def remaining_text(snap: RunSnapshot, phases: list[tuple[str, str]], now: float | None = None) -> str:
    """The status bar's remaining time: the whole run's when this config's phases were measured, else what the
    current phase has left at its own pace and how many phases come after it (their time is not known yet)."""
    status, state = snap.status, snap.state
    if state in ("stopped", "failed", "interrupted"):
        return "— (ended)"
    if state == "completed":
        return "0m 00s (done)"
    phase = str(status.get("phase") or "")
    started = parse_time(status.get("phase_started_at")) or parse_time(
        status.get({"sft": "sft_started_at", "grpo": "grpo_started_at"}.get(phase, "")))
    clock = dt.datetime.fromtimestamp(now) if now is not None else dt.datetime.now()
    in_phase = (clock - started).total_seconds() if started else None
    parts = remaining_parts(status, snap.config, in_phase)
    if parts is None:  # queued or starting: the first phase has not begun
        return "estimating once the run starts…"
    names = [name for name, _ in phases]
    slot = phase_slot(phase)
    later = len(names) - names.index(slot) - 1 if slot in names else 0
    # The phases themselves are listed just above (the phase strip): count them, do not repeat them.
    more = f"then {later} more phase{'s' if later != 1 else ''}" if later else ""
    if parts["current"] is None:
        if phase in ("sft", "grpo"):
            return "estimating from this phase's first steps…"
        return f"not timed for this config (this phase{', ' + more if more else ''})"
    if parts["measured"]:
        return f"{duration(parts['current'] + parts['later'])} (this phase {duration(parts['current'])})"
    if not later:
        return duration(parts["current"])
    return f"{duration(parts['current'])} in this phase, {more} not timed for this config"


def health_html(snap: RunSnapshot) -> str:
    """What the status bar warns of, in words: the signs of a collapse that `training.run.health` reads in the run's
    records (`#train-health`, its `data-signs` the rules that fired), and the newest periodic eval that failed
    (`#train-eval-error`: a crashed eval is not a 0% one). "" when there is nothing to say."""
    parts = []
    signs = collapse_signs(snap.metrics, snap.evals)
    if signs:
        items = "".join(f'<li data-sign="{html.escape(s.rule)}">{html.escape(s.text)}</li>' for s in signs)
        parts.append(f'<div id="train-health" class="sqe-warn-box" data-signs="{" ".join(s.rule for s in signs)}">'
                     f"<b>Signs of a collapse</b>: GRPO may be unlearning what the run started with."
                     f'<ul style="margin:4px 0 0 1.2em;padding:0">{items}</ul></div>')
    failed = [r for r in snap.evals if isinstance(r, dict) and r.get("error")]
    if failed:
        last = failed[-1]
        split, step = html.escape(str(last.get("split", "?"))), html.escape(str(last.get("step", "?")))
        more = f" ({len(failed)} evals failed in all)" if len(failed) > 1 else ""
        parts.append(f'<div id="train-eval-error" class="sqe-err-box">The eval on the {split} split at step {step} '
                     f"failed{more}: {html.escape(str(last['error']))}</div>")
    return "".join(parts)


def status_html(snap: RunSnapshot | None, note: str | None, runner_error: str | None = None) -> str:
    """The status bar: the run, its phases (`phase_strip_html`), the current phase's progress and the remaining
    time (`remaining_text`). Its data-* attributes expose the run, its status and phase and the newest plotted
    step, which the browser tests and the latency benchmark read."""
    if snap is None:
        body = f'<span class="sqe-muted">{html.escape(note or "No run yet: set the config and press Start.")}</span>'
        return f'<div id="train-status" class="sqe-card sqe-status" data-run="" data-status="none" data-step="">{body}</div>'
    status = snap.status
    state = snap.state
    p = progress(status, config=snap.config)
    # The newest plotted point: the step of the phase that logged last (SFT steps, then GRPO steps).
    latest_phase = next((r.get("phase", "grpo") for r in reversed(snap.metrics) if isinstance(r, dict)), None)
    plotted = charts.last_step(snap.metrics, latest_phase) if latest_phase else None
    kind = {"running": "ok", "completed": "ok", "queued": "warn", "stopped": "warn"}.get(state, "bad")
    total = p["total"] if p["total"] is not None else "?"
    phase = str(status.get("phase") or "")
    phases = planned_phases(status, phase)
    labels = dict(phases)
    names = [name for name, _ in phases]
    # The bar and the line under it follow the phase that runs: its own steps where it has them.
    pct = 0.0
    if phase == "sft" and isinstance(status.get("phase_step"), int) and isinstance(status.get("phase_total"), int):
        pct = 100.0 * status["phase_step"] / max(1, status["phase_total"])
        doing = f'warm start (SFT) step <b>{status["phase_step"]} / {status["phase_total"]}</b>, then {total} GRPO steps'
    elif phase in ("grpo", "saving"):
        pct = 100.0 * p["step"] / p["total"] if p["total"] else 0.0
        doing = f'GRPO step <b>{p["step"]} / {total}</b>' + (" · saving the model" if phase == "saving" else "")
    elif phase in labels:
        doing = f"<b>{html.escape(labels[phase])}</b>"
    else:
        doing = f"<b>{html.escape(PHASE_LABELS.get(phase, phase or state))}</b>"
    slot = phase_slot(phase)
    if slot in names and state not in ENDED:
        doing += f" (phase {names.index(slot) + 1} of {len(names)})"
    if state == "completed":
        pct = 100.0
        doing = f'GRPO step <b>{p["step"]} / {total}</b>'
    elif state in ENDED:  # say where it ended, not what it was doing
        where = ended_in(status, names)
        doing = f'{html.escape(state)} in <b>{html.escape(labels.get(where, where or "?"))}</b>'
        if where == "grpo":
            doing += f' at GRPO step <b>{p["step"]} / {total}</b>'
    error = status.get("error") or (runner_error if state == "failed" else None)
    err = f'<div class="sqe-err-box">{html.escape(str(error))}</div>' if error else ""
    # While a run trains on a GPU: its memory and the device's utilisation, from its heartbeat (nothing on CPU).
    gpu = readout_html(status.get("gpu")) if state == "running" else ""
    config = snap.config or {}
    parts = (config.get("model") or status.get("model"), config.get("dataset") or status.get("dataset"))
    return (
        f'<div id="train-status" class="sqe-card sqe-status" data-run="{html.escape(snap.run_id)}" '
        f'data-status="{html.escape(state)}" data-step="{p["step"]}" data-phase="{html.escape(str(status.get("phase", "")))}" '
        f'data-plotted-step="{plotted if plotted is not None else ""}" '
        f'data-plotted-phase="{html.escape(str(latest_phase or ""))}">'
        f'<div><b>{html.escape(snap.run_id)}</b> <span class="sqe-badge sqe-{kind}">{html.escape(state)}</span> '
        f'<span class="sqe-muted">{html.escape(" · ".join(str(v) for v in parts if v))}</span></div>'
        f"{phase_strip_html(phases, status, state)}"
        f'<div class="sqe-progress"><div style="width:{pct:.1f}%"></div></div>'
        f'<div class="sqe-progress-text" id="train-progress-text">{doing} · elapsed {duration(p["elapsed"])}'
        f' · remaining {remaining_text(snap, phases)}</div>'
        f"{health_html(snap)}{gpu}{err}</div>"
    )
