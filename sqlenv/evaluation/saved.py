"""A saved evaluation: the one on-disk format of an `evaluate()` run, written by `python -m sqlenv eval --out DIR`
and read by the dashboard's Compare tab (which adds it as a column beside a training run's policies).

Layout of ``DIR`` (by convention ``runs/evaluations/<name>/``, where the dashboard looks)::

    evaluation.json   {"format": "sqlenv-evaluation/1", "name", "created_at", "policy", "dataset", "split",
                       "seed", "step_budget", "n_episodes", "question_order": "all" | "seeded", <extra fields>,
                       "summary": EvaluationResult.to_dict(include_episodes=False)}
    episodes.jsonl    one transcript per line (the format of `sqlenv.transcript`), in play order

`question_order` says which questions were played: "all" is every question of the split once, in file order;
"seeded" is episode i on `reset(seed=seed + i)`, the questions a training run's comparison with the same seed and
split plays. The directory is written beside its target and renamed into place, so a reader never sees half of
one. Both files are read with `sqlenv.json_files`' bounds, as a run's are: `evaluation.json` of at most
`MAX_SUMMARY_BYTES`, episode lines of at most `MAX_EPISODE_BYTES` (a torn, corrupt, overlong or too deep line is
skipped), so one bad folder under `runs/evaluations/` reads as unreadable and the others still list.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlenv.json_files import read_json, read_records

__all__ = ["FORMAT", "SUMMARY_FILE", "EPISODES_FILE", "EVALUATIONS_FOLDER", "SavedEvaluation", "save_evaluation",
           "load_evaluation", "list_evaluations", "is_saved_evaluation"]

FORMAT = "sqlenv-evaluation/1"
SUMMARY_FILE = "evaluation.json"
EPISODES_FILE = "episodes.jsonl"
#: The folder under the runs folder where the dashboard lists saved evaluations.
EVALUATIONS_FOLDER = "evaluations"
#: The largest `evaluation.json` read (bytes): its summary's breakdown over Spider's 20 dev databases is ~30 KB.
MAX_SUMMARY_BYTES = 1024 * 1024
#: The largest episode line read (bytes): one transcript, as `training.run.directory.MAX_RECORD_BYTES`.
MAX_EPISODE_BYTES = 4 * 1024 * 1024


class SavedEvaluationError(ValueError):
    """A path that is not a saved evaluation, or one that cannot be written there. Messages are one line."""


@dataclass
class SavedEvaluation:
    """A saved evaluation read back: `meta` is `evaluation.json`, `episodes` the transcripts in play order."""

    path: Path
    meta: dict[str, Any]
    episodes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or self.path.name)

    @property
    def label(self) -> str:
        """A one-line description: name, policy, dataset/split, episodes."""
        m = self.meta
        return (f"{self.name} ({m.get('policy') or '?'} on {m.get('dataset') or '?'}/{m.get('split') or '?'}, "
                f"{m.get('n_episodes', len(self.episodes))} episodes)")


def is_saved_evaluation(path: Path | str) -> bool:
    return (Path(path) / SUMMARY_FILE).is_file()


def save_evaluation(result: Any, path: Path | str, *, dataset: str, split: str, step_budget: int,
                    question_order: str, name: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write `result` (an `EvaluationResult`) as a saved evaluation directory at `path`.

    Args:
        result: what `evaluate()` returned.
        path: the directory to write. An existing saved evaluation there is replaced; anything else that is not an
            empty folder is refused (`SavedEvaluationError`), so a typo cannot overwrite a run or a dataset.
        dataset, split, step_budget: what was evaluated (recorded, and shown by the Compare tab).
        question_order: "all" (every question of the split once) or "seeded" (episode i on seed + i).
        name: the name shown (default: the folder's name).
        extra: more JSON fields for `evaluation.json` (e.g. the model and endpoint of a served policy). Never put
            secrets here: the file is meant to be shared.
    """
    path = Path(path).expanduser()
    if path.exists() and not is_saved_evaluation(path) and (not path.is_dir() or any(path.iterdir())):
        raise SavedEvaluationError(f"{path} exists and is not a saved evaluation; choose another --out")
    if question_order not in ("all", "seeded"):
        raise SavedEvaluationError(f"question_order must be 'all' or 'seeded', got {question_order!r}")
    meta: dict[str, Any] = dict(extra or {})
    meta.update({
        "format": FORMAT, "name": name or path.name, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "policy": result.policy, "dataset": dataset, "split": split, "seed": result.seed, "step_budget": step_budget,
        "n_episodes": result.n_episodes, "question_order": question_order,
        "summary": result.to_dict(include_episodes=False),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        with open(tmp / EPISODES_FILE, "w", encoding="utf-8") as fh:
            for episode in result.episodes:
                fh.write(json.dumps(episode, default=str) + "\n")
        (tmp / SUMMARY_FILE).write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
        os.chmod(tmp, 0o755)
        from sqlenv.data.datasets import swap_into_place

        if path.is_dir() and not is_saved_evaluation(path):
            path.rmdir()  # the empty folder checked above
        swap_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_evaluation(path: Path | str, with_episodes: bool = True) -> SavedEvaluation:
    """Read a saved evaluation directory; `SavedEvaluationError` when `path` is not one.

    Args:
        path: the directory.
        with_episodes: also read `episodes.jsonl` (default True; False reads only `evaluation.json`, for listings).
    """
    path = Path(path)
    try:
        meta = read_json(path / SUMMARY_FILE, MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        raise SavedEvaluationError(f"{path} is not a saved evaluation (no {SUMMARY_FILE})") from None
    except (OSError, ValueError) as err:
        raise SavedEvaluationError(f"{path / SUMMARY_FILE} unreadable: {err}") from None
    if not isinstance(meta, dict):
        raise SavedEvaluationError(f"{path / SUMMARY_FILE} is not a JSON object")
    episodes: list[dict[str, Any]] = []
    if not with_episodes:
        return SavedEvaluation(path=path, meta=meta)
    try:
        with open(path / EPISODES_FILE, "rb") as fh:
            episodes = read_records(fh, MAX_EPISODE_BYTES)[0]
    except FileNotFoundError:
        pass
    return SavedEvaluation(path=path, meta=meta, episodes=episodes)


def list_evaluations(root: Path | str) -> list[Path]:
    """The saved evaluation directories directly under `root`, newest first (none when `root` is missing)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and is_saved_evaluation(p)]
    return sorted(found, key=lambda p: (p / SUMMARY_FILE).stat().st_mtime, reverse=True)
