"""A run's results as tables: its own policies' columns (random, zero-shot, base, trained) from its comparison, and
any columns' success and execution accuracy overall, per hardness and per database (`sqlenv.evaluation.breakdown`),
for the Compare tab and the Runs tab's run detail.

Everything is computed from the transcripts themselves, so runs written before EX and breakdowns existed still
show (their EX reads "–"). Columns added from elsewhere (saved evaluations, other runs) are the Compare tab's
(`dashboard.compare.added_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dashboard.core.formatting import MISSING, interval, percent, rate_cell
from sqlenv.evaluation.breakdown import breakdown

__all__ = ["SUMMARY_HEADERS", "Column", "pair_transcripts", "run_columns", "question_ids", "summary_frame",
           "breakdown_frame"]

SUMMARY_HEADERS = ["policy", "success rate", "success 95% CI", "EX", "EX 95% CI", "avg reward", "avg steps",
                   "episodes"]


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
        rows.append([column.label, percent(cell["success_rate"] if cell["n"] else None), interval(cell["success_ci"]),
                     percent(cell["execution_accuracy"]), interval(cell["execution_ci"]),
                     f"{reward:.3f}" if reward is not None else MISSING,
                     f"{steps:.1f}" if steps is not None else MISSING, episodes])
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
                row += [MISSING, MISSING]
                continue
            row.append(rate_cell(c["success_rate"], c["success_ci"], c["n"]))
            row.append(rate_cell(c["execution_accuracy"], c["execution_ci"], c["n_execution"]))
        rows.append(row)
    return pd.DataFrame(rows, columns=headers)
