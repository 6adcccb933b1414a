"""The Compare tab's columns: a run's own policies (random, zero-shot, base, trained) and columns added from a saved evaluation
(`sqlenv.evaluation.saved`, under `runs/evaluations/`) or from another run's trained model, all scored on the same
eval questions, with success and execution accuracy overall, per hardness and per database
(`sqlenv.evaluation.breakdown`).

Everything is computed from the transcripts themselves, so runs written before EX and breakdowns existed still
show (their EX reads "–"). An added column keeps only its episodes on questions the run played (matched by
question id: a Spider question keeps its id in every dataset prepared from Spider), and says how many of the run's
questions it covers. Names from the page go through `training.run.directory.resolve_run`, under the runs folder or its
`evaluations/` folder only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dashboard.inputs import InputRefused, quote
from sqlenv.evaluation.breakdown import breakdown
from sqlenv.evaluation.saved import EVALUATIONS_FOLDER, SavedEvaluationError, list_evaluations, load_evaluation
from training.run.directory import InvalidRunName, resolve_run

SUMMARY_HEADERS = ["policy", "success rate", "success 95% CI", "EX", "EX 95% CI", "avg reward", "avg steps",
                   "episodes"]
#: Prefixes of an added column's value: a saved evaluation, or another run's trained model.
EVAL_PREFIX, RUN_PREFIX = "eval:", "run:"
#: Most columns added at once (each one reads a file).
MAX_ADDED = 6


@dataclass
class Column:
    """One policy's episodes on the eval questions, and a note (e.g. how many of the run's questions it covers)."""

    label: str
    episodes: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""


BASELINE_KEYS = ("random", "baseline", "random_transcript")
TRAINED_KEYS = ("trained", "model", "trained_transcript")


def pair_transcripts(pair: dict[str, Any]) -> tuple[dict | None, dict | None, dict | None]:
    """(random, trained, base) transcripts of a comparison pair record (nested under "transcripts" or not)."""
    source = pair.get("transcripts") if isinstance(pair.get("transcripts"), dict) else pair

    def pick(keys):
        return next((source[k] for k in keys if isinstance(source.get(k), dict)), None)

    return pick(BASELINE_KEYS), pick(TRAINED_KEYS), pick(("base", "base_model"))


def run_columns(snap: Any) -> list[Column]:
    """The run's own columns from its comparison pairs: random, zero-shot (a warm-started pretrained model before any
    training), base (when played), trained."""
    sides: dict[str, list[dict]] = {"random": [], "zero_shot": [], "base": [], "trained": []}
    for pair in snap.pairs:
        random_t, trained_t, base_t = pair_transcripts(pair)
        source = pair.get("transcripts") if isinstance(pair.get("transcripts"), dict) else pair
        zero_t = source.get("zero_shot") if isinstance(source.get("zero_shot"), dict) else None
        for key, transcript in (("random", random_t), ("zero_shot", zero_t), ("base", base_t),
                                ("trained", trained_t)):
            if transcript is not None:
                sides[key].append(transcript)
    summary = snap.summary or {}
    base_label = f"base: {summary['base_label']}" if summary.get("base_label") else "base"
    labels = {"random": "random", "zero_shot": "zero-shot: pretrained, before any training", "base": base_label,
              "trained": "trained"}
    most = max((len(episodes) for episodes in sides.values()), default=0)
    # A CPU recipe plays the zero-shot model on the first questions only (`zero_shot_episodes`).
    return [Column(labels[key], episodes, f"the first {len(episodes)} of {most} questions" if len(episodes) < most else "")
            for key, episodes in sides.items() if episodes]


def question_ids(columns: list[Column]) -> list[str]:
    """The question ids the run played, in order (from its first column)."""
    return [str(ep.get("question_id")) for ep in columns[0].episodes] if columns else []


def source_choices(runs: Any, exclude: str | None = None) -> list[tuple[str, str]]:
    """(label, value) of every column that can be added: saved evaluations, then runs with a comparison."""
    choices = []
    for path in list_evaluations(runs.runs_root / EVALUATIONS_FOLDER):
        try:
            choices.append((f"evaluation: {load_evaluation(path, with_episodes=False).label}",
                            EVAL_PREFIX + path.name))
        except SavedEvaluationError:
            continue
    for row in runs.list():
        run_id = row["run_id"]
        if run_id != exclude and (runs.runs_root / run_id / "comparison.jsonl").exists():
            choices.append((f"run: {run_id} (trained)", RUN_PREFIX + run_id))
    return choices


def load_source(runs: Any, value: Any) -> Column:
    """The column a page asked for (`eval:<name>` or `run:<id>`); `InputRefused` with the reason otherwise."""
    if not isinstance(value, str) or not value.startswith((EVAL_PREFIX, RUN_PREFIX)):
        raise InputRefused(f"Unknown column {quote(value)}.")
    kind, name = value.split(":", 1)
    try:
        if kind + ":" == EVAL_PREFIX:
            saved = load_evaluation(resolve_run(name, runs.runs_root / EVALUATIONS_FOLDER).path)
            return Column(f"evaluation: {saved.name}", saved.episodes)
        snap = runs.snapshot(name)
    except (InvalidRunName, FileNotFoundError, SavedEvaluationError, OSError) as exc:
        raise InputRefused(f"Cannot add {quote(value)}: {exc}") from None
    trained = next((c for c in run_columns(snap) if c.label == "trained"), None)
    if trained is None:
        raise InputRefused(f"Run {quote(name)} has no comparison yet.")
    return Column(f"run: {snap.run_id}", trained.episodes)


def on_questions(column: Column, ids: list[str]) -> Column:
    """`column` restricted to the questions in `ids`, with a note saying how many of them it covers."""
    wanted = set(ids)
    kept = [ep for ep in column.episodes if str(ep.get("question_id")) in wanted]
    covered = len({str(ep.get("question_id")) for ep in kept})
    note = f"{covered} of {len(wanted)} questions" if covered < len(wanted) else ""
    return Column(column.label, kept, note)


def _pct(rate: Any) -> str:
    return f"{rate:.0%}" if isinstance(rate, (int, float)) else "–"


def _ci(ci: Any) -> str:
    return f"{ci[0]:.0%}–{ci[1]:.0%}" if isinstance(ci, (list, tuple)) and len(ci) == 2 else "–"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary_frame(columns: list[Column]) -> pd.DataFrame:
    """One row per column: success and EX with 95% intervals, avg reward, avg steps, episodes."""
    rows = []
    for column in columns:
        cell = breakdown(column.episodes)["overall"]
        reward = _mean([float(ep.get("total_reward") or 0.0) for ep in column.episodes])
        steps = _mean([float(ep.get("n_steps") or 0) for ep in column.episodes])
        episodes = f"{cell['n']}" + (f" ({column.note})" if column.note else "")
        rows.append([column.label, _pct(cell["success_rate"] if cell["n"] else None), _ci(cell["success_ci"]),
                     _pct(cell["execution_accuracy"]), _ci(cell["execution_ci"]),
                     f"{reward:.3f}" if reward is not None else "–", f"{steps:.1f}" if steps is not None else "–",
                     episodes])
    return pd.DataFrame(rows, columns=SUMMARY_HEADERS)


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def breakdown_frame(columns: list[Column], by: str) -> pd.DataFrame:
    """Rows per hardness level (`by="hardness"`, after an `all` row) or per database; for each column its success
    and EX, each "rate [95% CI] (n)". A column with no episode in a row shows "–"."""
    if by not in ("hardness", "database"):
        raise ValueError(f"by must be 'hardness' or 'database', got {by!r}")
    cells = [breakdown(c.episodes) for c in columns]
    keys: list[str] = ["all"] if by == "hardness" else []
    for cell in cells:
        keys += [k for k in cell[by] if k not in keys]
    if by == "database":
        keys.sort()
    labels = _unique([c.label for c in columns])
    headers = [by] + [f"{label} {what}" for label in labels for what in ("success", "EX")]
    rows = []
    for key in keys:
        row = [key]
        for cell in cells:
            c = cell["overall"] if key == "all" else cell[by].get(key)
            if c is None or not c["n"]:
                row += ["–", "–"]
                continue
            row.append(f"{_pct(c['success_rate'])} [{_ci(c['success_ci'])}] ({c['n']})")
            row.append(f"{_pct(c['execution_accuracy'])} [{_ci(c['execution_ci'])}] ({c['n_execution']})"
                       if c["execution_accuracy"] is not None else "–")
        rows.append(row)
    return pd.DataFrame(rows, columns=headers)


def columns_for(runs: Any, snap: Any, added: Any) -> tuple[list[Column], list[str]]:
    """The run's columns plus the `added` ones on its questions, and the messages of those refused."""
    columns = run_columns(snap)
    ids = question_ids(columns)
    problems: list[str] = []
    values = [] if added is None else added
    if not isinstance(values, (list, tuple)):
        return columns, ["Added columns must be a list."]
    if len(values) > MAX_ADDED:
        return columns, [f"Too many added columns: {len(values)} (at most {MAX_ADDED})."]
    for value in values:
        try:
            column = on_questions(load_source(runs, value), ids)
        except InputRefused as exc:
            problems.append(str(exc))
            continue
        if not column.episodes:
            problems.append(f"{column.label} played none of this run's eval questions.")
            continue
        columns.append(column)
    return columns, problems
