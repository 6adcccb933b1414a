"""`python -m training.runs list [--runs-dir DIR] [--json]`: every run under the runs folder, newest first.

Prints one line per run — id, status, GRPO step / total, model, dataset, success and EX, and what they measured
(the trained model in the final comparison, else the model at its last periodic eval, with the question count: the
words the dashboard's Runs tab uses; "-" before EX) — or, with `--json`, one JSON object per line with the same
fields and more (`training.run.listing.list_runs`). A run whose process died reads `interrupted` (see
`training.run.directory.live_status`), and `resumable` says whether `python -m training.train --resume` can continue it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.run.directory import default_runs_root
from training.run.listing import list_runs

__all__ = ["main", "format_table"]

COLUMNS = ("run", "status", "steps", "model", "dataset", "success", "EX", "measured on")


def _row(run: dict) -> tuple[str, ...]:
    step, total = run.get("step"), run.get("total_steps")
    success, execution = run.get("final_success"), run.get("final_execution")
    return (str(run.get("run_id")), str(run.get("status")),
            f"{step if step is not None else '?'}/{total if total is not None else '?'}",
            str(run.get("model", "?")), str(run.get("dataset", "?")),
            f"{success:.0%}" if isinstance(success, (int, float)) else "-",
            f"{execution:.0%}" if isinstance(execution, (int, float)) else "-",
            str(run.get("final_measured_on") or "-"))


def format_table(runs: list[dict]) -> str:
    """The runs as an aligned text table (header first)."""
    rows = [COLUMNS] + [_row(r) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"python -m training.runs: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="python -m training.runs", description="List SQLEnv training runs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    listing = sub.add_parser("list", help="every run: id, status, step/total, model, dataset, success, EX and what they measured")
    listing.add_argument("--runs-dir", type=Path, default=None,
                         help="runs folder (default $SQLENV_RUNS_DIR or runs/)")
    listing.add_argument("--json", action="store_true", help="one JSON object per run and line")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    root = args.runs_dir if args.runs_dir is not None else default_runs_root()
    if args.runs_dir is not None and not root.is_dir():
        print(f"python -m training.runs: error: --runs-dir {root}: no such folder", file=sys.stderr)
        return 2
    runs = list_runs(root)
    if args.json:
        for run in runs:
            print(json.dumps(run, default=str))
    elif runs:
        print(format_table(runs))
    else:
        print(f"no runs under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
