"""Readable HTML for the one transcript format of `sqlenv.transcript` (pure functions, everything escaped).

A transcript is a dict: question, database, gold SQL/answer, and `steps`, each with the action, the argument,
the observation (or error), the step reward and its layers (operational / progress / terminal), the budget
left; then the answer, the verdict (`correct`, `outcome`) and the episode's reward breakdown. Model-written
text goes into the page, so every value is HTML-escaped. The classes used are styled in `dashboard.style`.
"""

from __future__ import annotations

import html
import json
from typing import Any

from dashboard.core.formatting import MISSING, as_float

OUTCOME_LABELS = {
    "correct": ("correct", "ok"),
    "wrong_answer": ("wrong answer", "bad"),
    "budget_exhausted": ("budget exhausted", "bad"),
    "unfinished": ("unfinished", "warn"),
    "error": ("error", "bad"),
}
MAX_OBSERVATION_CHARS = 2000


def esc(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        value = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return html.escape(value)


def fmt_reward(value: Any, signed: bool = True) -> str:
    number = as_float(value)
    if number is None:
        return MISSING
    return f"{number:+.3f}" if signed else f"{number:.3f}"


def format_gold(gold: Any) -> str:
    """Gold answers are stored typed (number, list, rows); show them the way an answer is typed."""
    if isinstance(gold, list):
        if gold and all(isinstance(row, (list, tuple)) for row in gold):
            return "\n".join(" | ".join(str(v) for v in row) for row in gold)
        return ", ".join(str(v) for v in gold) if gold else "[]"
    return "" if gold is None else str(gold)


def execution_note(transcript: dict[str, Any]) -> str:
    """Whether the episode's last successful QUERY matches the gold query (EX, the official Spider rules:
    `sqlenv.scoring.execution`); nothing for transcripts without it."""
    match = transcript.get("execution_match")
    if not isinstance(match, bool):
        return ""
    text = ("the last successful QUERY matches the gold query (official Spider EX)" if match
            else "the last successful QUERY (if any) does not match the gold query (official Spider EX)")
    return f'<div class="sqe-ex" data-ex="{str(match).lower()}"><b>EX</b> {"✓" if match else "✗"} {text}</div>'


def verdict_badge(transcript: dict[str, Any]) -> str:
    outcome = transcript.get("outcome")
    if outcome is None:
        outcome = "correct" if transcript.get("correct") else "unfinished"
    label, kind = OUTCOME_LABELS.get(str(outcome), (str(outcome), "warn"))
    return f'<span class="sqe-badge sqe-{kind}">{esc(label)}</span>'


def layers_html(layers: Any, reward: Any = None) -> str:
    """`op +0.010 · prog +0.000 · term +1.000 = +1.010` as small chips."""
    layers = layers if isinstance(layers, dict) else {}
    chips = []
    for key, short in (("operational", "op"), ("progress", "prog"), ("terminal", "term")):
        value = as_float(layers.get(key))
        cls = "sqe-chip" + (" sqe-zero" if not value else "")
        chips.append(f'<span class="{cls}" title="{key}">{short} {fmt_reward(value)}</span>')
    total = layers.get("total", reward)
    return f'{"".join(chips)}<span class="sqe-total">= {fmt_reward(total)}</span>'


def step_row(step: dict[str, Any], index: int) -> str:
    error = step.get("error") or ""
    observation = step.get("observation") or ""
    text = str(error or observation)
    if len(text) > MAX_OBSERVATION_CHARS:
        text = text[:MAX_OBSERVATION_CHARS] + f"\n… ({len(text) - MAX_OBSERVATION_CHARS} more characters)"
    obs_cls = "sqe-obs sqe-err" if error else "sqe-obs"
    budget = step.get("budget_remaining")
    return (
        f'<tr><td class="sqe-n">{esc(step.get("step", index + 1))}</td>'
        f'<td><span class="sqe-act sqe-act-{esc(str(step.get("action_type", "")).lower())}">'
        f'{esc(step.get("action_type", "?"))}</span><pre class="sqe-arg">{esc(step.get("argument", ""))}</pre></td>'
        f'<td><pre class="{obs_cls}">{esc(text)}</pre></td>'
        f'<td class="sqe-rew">{layers_html(step.get("layers"), step.get("reward"))}</td>'
        f'<td class="sqe-n">{esc(budget) if budget is not None else "–"}</td></tr>'
    )


def steps_table(steps: list[dict[str, Any]]) -> str:
    if not steps:
        return '<p class="sqe-muted">No actions yet.</p>'
    rows = "".join(step_row(s, i) for i, s in enumerate(steps) if isinstance(s, dict))
    return (
        '<table class="sqe-steps"><thead><tr><th>#</th><th>action</th>'
        '<th>observation</th><th>step reward (layers)</th><th title="budget left">left</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def transcript_html(transcript: dict[str, Any] | None, title: str | None = None, show_gold: bool = True,
                    compact: bool = False) -> str:
    """A whole episode: header (question, database, difficulty), every step, then the verdict vs the gold.
    `compact`: narrower fixed columns, for three transcripts side by side."""
    if not isinstance(transcript, dict):
        return f'<div class="sqe-card sqe-muted">{esc(title) + ": " if title else ""}no transcript</div>'
    head = f'<div class="sqe-title">{esc(title)} {verdict_badge(transcript)}</div>' if title else ""
    policy = transcript.get("policy")
    meta = " · ".join(
        esc(v) for v in (
            f"database {transcript.get('database', '?')}",
            transcript.get("difficulty"),
            f"answer type {transcript.get('answer_type')}" if transcript.get("answer_type") else None,
            f"question {transcript.get('question_id')}" if transcript.get("question_id") else None,
            f"policy {policy}" if policy else None,
        ) if v
    )
    steps = transcript.get("steps") if isinstance(transcript.get("steps"), list) else []
    breakdown = transcript.get("reward_breakdown") if isinstance(transcript.get("reward_breakdown"), dict) else {}
    verdict = (
        f'<div class="sqe-verdict"><div>{verdict_badge(transcript)} '
        f'<b>answer:</b> <code>{esc(transcript.get("answer") if transcript.get("answer") is not None else "—")}</code></div>'
        f"{execution_note(transcript)}"
        f'<div><b>total reward</b> {fmt_reward(transcript.get("total_reward"))} '
        f'<span class="sqe-muted">(operational {fmt_reward(breakdown.get("operational"))}, '
        f'progress {fmt_reward(breakdown.get("progress"))}, correctness {fmt_reward(breakdown.get("correctness"), False)})'
        f"</span> · {esc(transcript.get('n_steps', len(steps)))} steps</div></div>"
    )
    gold = ""
    if show_gold:
        gold = (
            '<div class="sqe-gold"><div><b>gold answer:</b> '
            f'<pre class="sqe-inline">{esc(format_gold(transcript.get("gold_answer")))}</pre></div>'
            f'<div><b>gold SQL:</b> <pre class="sqe-inline">{esc(transcript.get("gold_sql", ""))}</pre></div></div>'
        )
    return (
        f'<div class="sqe-card{" sqe-compact" if compact else ""}">{head}'
        f'<div class="sqe-question">{esc(transcript.get("question", ""))}</div>'
        f'<div class="sqe-meta">{meta}</div>'
        f"{steps_table(steps)}{verdict}{gold}</div>"
    )
