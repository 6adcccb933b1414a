"""The ONE episode transcript format, shared by evaluation, training and the dashboard.

```
{"question_id","question","database","difficulty","answer_type","gold_sql","gold_answer",
 "policy": str|null, "seed": int|null,
 "steps": [{"step","action_type","argument","observation","error","reward",
            "layers": {"operational","progress","terminal","total"},"budget_remaining","done",
            "terminated","truncated"}],
 "answer": str|null, "correct": bool,
 "outcome": "correct"|"wrong_answer"|"budget_exhausted"|"unfinished"|"error",
 "total_reward": float, "reward_breakdown": {"operational","progress","correctness","total"}, "n_steps": int,
 "execution_match": bool|null}
```

A step's `done` says the episode ended there; `terminated` (ANSWER) and `truncated` (the step budget ran out, or
the connection to a server was lost) say how, as Gymnasium does. Transcripts written before those two keys
existed still validate: `STEP_KEYS` lists what every transcript has.

`execution_match` is the episode's execution accuracy (`sqlenv.scoring.execution`): whether the agent's last successful
QUERY matches the gold query under test-suite-sql-eval's `eval_exec_match` (the official Spider EX). It is null
while the episode runs, and absent from transcripts written before it existed (readers treat both as unknown).
A finished episode's is null too when the step that ended it left too little time for the query EX must run; the
optional "execution_note" then says so. Transcripts written before issue 27 scored it with a more lenient
comparison (docs/EXPERIMENTS.md, "Official EX").

Optional keys: "execution_note" (above); "error" and "traceback" (outcome "error"); "wall_s" (seconds the episode
took) and, for policies that count it (`sqlenv.evaluation.openai_policy.OpenAIPolicy`), "usage":
{"requests","prompt_tokens","completion_tokens","total_tokens","tool_calls","text_turns","latency_s"}, both added by
`sqlenv.evaluation.concurrent`.
"""

from __future__ import annotations

from typing import Any

OUTCOMES = ("correct", "wrong_answer", "budget_exhausted", "unfinished", "error")
TRANSCRIPT_KEYS = ("question_id", "question", "database", "difficulty", "answer_type", "gold_sql", "gold_answer",
                   "policy", "seed", "steps", "answer", "correct", "outcome", "total_reward", "reward_breakdown",
                   "n_steps")
STEP_KEYS = ("step", "action_type", "argument", "observation", "error", "reward", "layers", "budget_remaining",
             "done")


def make_step(step: int, action_type: str, argument: str, observation: str, error: str, reward: float,
              layers: dict[str, float], budget_remaining: int, done: bool, *, terminated: bool = False,
              truncated: bool = False) -> dict[str, Any]:
    """One step record of a transcript (it keeps `layers` itself: pass a dict of its own). `terminated` and
    `truncated` say how a step with `done` ended the episode (see the module docstring)."""
    return {"step": step, "action_type": action_type, "argument": argument, "observation": observation,
            "error": error, "reward": reward, "layers": layers, "budget_remaining": budget_remaining,
            "done": done, "terminated": terminated, "truncated": truncated}


def make_transcript(question: Any, *, policy: str | None, seed: int | None, steps: list[dict[str, Any]],
                    answer: str | None, correct: bool, outcome: str, reward_breakdown: Any,
                    execution_match: bool | None = None, execution_note: str | None = None) -> dict[str, Any]:
    """One episode's transcript: `question` (a `sqlenv.types.Question`, or None when unknown) and the step records
    (`make_step`; copied, so the transcript does not change with them). `reward_breakdown` has `to_dict()`;
    `execution_match` is the episode's EX (None: unknown, e.g. the episode still runs), and `execution_note` why a
    finished episode's is unknown (the key only when given)."""
    q = question
    transcript = {
        "question_id": q.question_id if q else None,
        "question": q.question_text if q else None,
        "database": q.database_name if q else None,
        "difficulty": q.difficulty if q else None,
        "answer_type": q.answer_type if q else None,
        "gold_sql": q.gold_sql if q else None,
        "gold_answer": q.gold_answer if q else None,
        "policy": policy,
        "seed": seed,
        "steps": [dict(s, layers=dict(s["layers"])) for s in steps],
        "answer": answer,
        "correct": bool(correct),
        "outcome": outcome,
        "total_reward": sum(step["reward"] for step in steps),
        "reward_breakdown": reward_breakdown.to_dict(),
        "n_steps": len(steps),
        "execution_match": execution_match,
    }
    if execution_note is not None:
        transcript["execution_note"] = execution_note
    return transcript


def validate_transcript(transcript: dict[str, Any]) -> None:
    """Raise ValueError when `transcript` does not have the shared format's keys and outcome values."""
    missing = [k for k in TRANSCRIPT_KEYS if k not in transcript]
    if missing:
        raise ValueError(f"transcript is missing keys: {', '.join(missing)}")
    if transcript["outcome"] not in OUTCOMES:
        raise ValueError(f"unknown outcome {transcript['outcome']!r}; expected one of {', '.join(OUTCOMES)}")
    for i, step in enumerate(transcript["steps"]):
        missing = [k for k in STEP_KEYS if k not in step]
        if missing:
            raise ValueError(f"step {i} is missing keys: {', '.join(missing)}")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in str(text).splitlines()) if text else prefix + "(empty)"


def render_transcript_text(transcript: dict[str, Any]) -> str:
    """A transcript as readable plain text (for terminals, logs and the dashboard's text view)."""
    t = transcript
    lines = [
        f"Question [{t.get('question_id')}] ({t.get('database')}, {t.get('difficulty')}, {t.get('answer_type')}):",
        f"  {t.get('question')}",
    ]
    if t.get("policy") or t.get("seed") is not None:
        lines.append(f"Policy: {t.get('policy') or '-'}   seed: {t.get('seed')}")
    for s in t.get("steps", []):
        layers = s.get("layers") or {}
        lines.append(
            f"Step {s.get('step')}: {s.get('action_type')} {s.get('argument')}".rstrip()
            + f"   reward {s.get('reward', 0.0):+.3f} (op {layers.get('operational', 0.0):+.3f},"
            f" prog {layers.get('progress', 0.0):+.3f}, term {layers.get('terminal', 0.0):+.3f})"
            f"   budget {s.get('budget_remaining')}{'   DONE' if s.get('done') else ''}")
        if s.get("error"):
            lines.append(_indent("ERROR: " + str(s["error"])))
        elif s.get("observation"):
            lines.append(_indent(s["observation"]))
    rb = t.get("reward_breakdown") or {}
    lines.append(f"Answer: {t.get('answer')!r}   correct: {t.get('correct')}   outcome: {t.get('outcome')}")
    lines.append(f"Gold SQL: {t.get('gold_sql')}")
    lines.append(f"Gold answer: {t.get('gold_answer')!r}")
    lines.append(
        f"Total reward {float(t.get('total_reward', 0.0)):+.3f} = operational {rb.get('operational', 0.0):+.3f}"
        f" + progress {rb.get('progress', 0.0):+.3f} + correctness {rb.get('correctness', 0.0):+.3f}"
        f"   ({t.get('n_steps')} steps)")
    return "\n".join(lines)
