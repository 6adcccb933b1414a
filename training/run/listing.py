"""The listing of a runs folder: one row per run, newest first (`python -m training.runs list`, the dashboard's
Runs tab)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.run.directory import InvalidRunName, last_checkpoint, resolve_run
from training.run.results import final_measure
from training.run.schema import RESUMABLE_STATUSES, TRAINER_PHASES, default_runs_root

__all__ = ["has_checkpoint", "list_runs"]


def has_checkpoint(run_path: Path) -> bool:
    """Whether the run holds a checkpoint to resume from (or a completed warm start)."""
    folder = Path(run_path) / "checkpoints"
    return any(last_checkpoint(folder / phase) for phase in TRAINER_PHASES) or (Path(run_path) / "warm_start").is_dir()


def list_runs(root: Path | None = None) -> list[dict[str, Any]]:
    """A summary of every run under `root`, newest first. A broken run is listed as such, and the others as usual:
    status "missing" (no status.json) or "corrupt" (its status.json or config.json unreadable: malformed, too
    large or too deep, see `read_json`), its `error` saying which file and why."""
    root = Path(root) if root is not None else default_runs_root()
    if not root.is_dir():
        return []
    rows = []
    for path in root.iterdir():
        if not path.is_dir() or path.name.startswith(".") or path.name in ("models", "evaluations"):
            continue
        try:
            run = resolve_run(path.name, root)  # the same containment check as opening a run
        except (InvalidRunName, OSError):
            continue
        status = run.read_live_status()
        try:
            config = run.read_config()
        except FileNotFoundError:  # not written yet (a run being created), or never: nothing to show
            config = {}
        except (OSError, ValueError) as exc:
            config = {}
            status = {**status, "status": "corrupt", "error": f"config.json unreadable: {exc}"}
        evals = run.read("evals")
        eval_split = config.get("eval_split", "eval")
        final_eval = next((e for e in reversed(evals) if e.get("split") == eval_split and not e.get("error")), None)
        summary = next((c for c in reversed(run.read("comparison")) if c.get("kind") == "summary"), None)
        # The headline: the final comparison, else the last periodic eval, success and EX from the same one.
        measured = final_measure(summary, evals, eval_split)
        rows.append(
            {
                "run_id": run.run_id,
                "status": status.get("status", "unknown"),
                "error": status.get("error"),
                "model": config.get("model", "?"),
                "dataset": config.get("dataset", "?"),
                "step": status.get("step"),
                "total_steps": status.get("total_steps"),
                "eval_success": final_eval.get("success_rate") if final_eval else None,
                "final_success": measured.success if measured else None,
                "final_execution": measured.execution if measured else None,  # runs before EX read None
                "final_measured_on": measured.label if measured else None,
                "resumable": status.get("status") in RESUMABLE_STATUSES,
                "checkpoint": has_checkpoint(run.path),
                "started_at": status.get("started_at") or status.get("created_at"),
                "mtime": path.stat().st_mtime,
            }
        )
    rows.sort(key=lambda r: r["mtime"], reverse=True)
    return rows
