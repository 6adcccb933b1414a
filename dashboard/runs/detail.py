"""The Runs tab's run detail: the header (status, steps, elapsed time, how many records, the headline result in the
table's words, which weights the run kept, its errors), its results by hardness, and its transcripts' picker.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard.core.formatting import MISSING, duration, rate_cell
from dashboard.core.progress import progress
from dashboard.core.results import breakdown_frame, run_columns
from dashboard.core.run_notes import kept_html
from dashboard.core.transcripts import esc
from training.run.results import comparison_measure, last_eval_measure

__all__ = ["success_html", "detail_header", "lines_text", "results_frame", "transcript_choices"]


def success_html(snap) -> str:
    """The run's headline result and, when that is the final comparison, its last periodic eval too: each with
    what it measured, in the Runs table's words."""
    split = str((snap.config or {}).get("eval_split") or "eval")
    lines = []
    for kind, measured in (("final", comparison_measure(snap.summary, split)),
                           ("eval", last_eval_measure(snap.evals, split))):
        if measured is not None:
            lines.append(f'<div data-measure="{kind}"><b>{esc(measured.rates())}</b> — {esc(measured.label)}</div>')
    if not lines:
        lines.append('<div data-measure="none">success not measured yet (no eval or comparison)</div>')
    return f'<div class="sqe-meta" id="runs-detail-success">{"".join(lines)}</div>'


def detail_header(snap) -> str:
    status = snap.status
    p = progress(status)
    state = snap.state
    kind = {"running": "ok", "completed": "ok", "queued": "warn", "stopped": "warn"}.get(state, "bad")
    problems = []
    if status.get("error"):
        problems.append(str(status["error"]))
    if snap.config_error:
        problems.append(snap.config_error)
    errs = "".join(f'<div class="sqe-err-box">{esc(p_)}</div>' for p_ in problems)
    return (
        f'<div class="sqe-card sqe-status" id="runs-detail-status" data-run="{esc(snap.run_id)}" data-status="{esc(state)}">'
        f'<div><b>{esc(snap.run_id)}</b> <span class="sqe-badge sqe-{kind}">{esc(state)}</span></div>'
        f'<div class="sqe-meta">step {p["step"]} / {p["total"] if p["total"] is not None else "?"} · elapsed '
        f'{duration(p["elapsed"])} · {lines_text(snap)}</div>{success_html(snap)}'
        f'{kept_html(snap, "runs-detail-kept")}{errs}</div>'
    )


def lines_text(snap) -> str:
    """How many metric lines, evals and traces the run wrote ("~" where counted from a sample), and, when its
    charts draw fewer points than it logged, that they draw a spread of them."""
    parts, charted = [], ""
    for kind, label, kept in (("metrics", "metric lines", snap.metrics), ("evals", "evals", snap.evals),
                              ("transcripts", "traces", snap.transcripts)):
        lines, exact = snap.line_counts.get(kind, (len(kept), True))
        parts.append(f"{'' if exact else '~'}{lines:,} {label}")
        if kind == "metrics" and lines > len(kept):
            charted = f" (charts: {len(kept):,} of them, spread over the run, and the newest)"
    return " · ".join(parts) + charted


def results_frame(snap) -> pd.DataFrame:
    """The run's results by hardness: its final comparison (random / base / trained), else the last eval on each
    split as it recorded its breakdown (runs from before breakdowns: the overall success alone)."""
    if snap is None:
        return pd.DataFrame(columns=["hardness"])
    columns = run_columns(snap)
    if columns:
        return breakdown_frame(columns, "hardness")
    last: dict[str, dict] = {}
    for record in snap.evals:
        if isinstance(record, dict) and record.get("split"):
            last[str(record["split"])] = record
    if not last:
        return pd.DataFrame(columns=["hardness"])
    headers = ["hardness"] + [f"{split} (step {r.get('step', '?')}) {what}" for split, r in last.items()
                              for what in ("success", "EX")]
    keys = ["all"]
    for record in last.values():
        keys += [k for k in ((record.get("breakdown") or {}).get("hardness") or {}) if k not in keys]
    rows = []
    for key in keys:
        row = [key]
        for record in last.values():
            cells = record.get("breakdown") or {}
            cell = cells.get("overall") if key == "all" else (cells.get("hardness") or {}).get(key)
            if cell is None and key == "all":  # an eval line written before breakdowns
                row += [rate_cell(record.get("success_rate"), None, record.get("n_episodes", "?")), MISSING]
                continue
            if not isinstance(cell, dict):
                row += [MISSING, MISSING]
                continue
            row.append(rate_cell(cell.get("success_rate"), cell.get("success_ci"), cell.get("n")))
            row.append(rate_cell(cell.get("execution_accuracy"), cell.get("execution_ci"), cell.get("n_execution")))
        rows.append(row)
    return pd.DataFrame(rows, columns=headers)


def transcript_choices(snap) -> list:
    """The picker's (label, byte offset of its line) of the traces the snapshot lists, newest first."""
    choices = []
    for summary in snap.transcripts:
        if summary.get("has_transcript"):
            step = summary["step"] if summary.get("step") is not None else "?"
            choices.append((f"step {step} — {summary['outcome'] or '?'} — {summary['question_id']}",
                            summary["offset"]))
    return choices[::-1]
