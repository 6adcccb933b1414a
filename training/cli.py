"""The training CLI: `python -m training.train` (a `TrainConfig` JSON, `--set` overrides, `--resume`).

    python -m training.train --config configs/tiny_cpu.json --set max_steps=20 --set grpo.loss_type=dr_grpo
    python -m training.train --resume runs/<id>

It checks the config (its values, then what they name: `training.plan.check_config`) before anything loads, so a bad
argument prints one line and exits with code 2; then it runs `training.train.run_training` (or `resume_training`)
with `progress_listener` printing one line per phase change, GRPO log and eval, and the comparison's summary. The
last line of a finished run is one JSON object: `{"run_dir": ..., "status": ...}`. Exit codes: 0 the run ended
(completed or stopped), 1 it failed, 2 a bad argument, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from training.config import ConfigError, TrainConfig
from training.distributed import is_main_process
from training.run.directory import RunDir

if TYPE_CHECKING:  # transformers loads with it: a bad argument is refused before any of that
    from training.run.recorder import Listener

__all__ = ["main", "progress_listener"]


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


SFT_LINE_SECONDS = 10.0


def progress_listener(total_hint: int) -> Listener:
    """The CLI's terminal progress, as a `run_training` listener: one line per status change, GRPO metrics log
    and eval, an SFT line at most every `SFT_LINE_SECONDS`, and the comparison's summary. `total_hint`: GRPO
    steps."""
    t0 = time.time()
    last_phase: list[str | None] = [None]
    last_sft_line = [-1e9]  # SFT logs every few steps: one line per SFT_LINE_SECONDS is enough for a terminal

    def listener(event: str, payload: dict) -> None:
        elapsed = time.time() - t0
        if event == "status":
            phase = payload.get("phase")
            if phase != last_phase[0] or payload.get("status") in ("failed", "stopped", "completed"):
                last_phase[0] = phase
                line = f"[{elapsed:7.1f}s] {payload.get('status')}: {phase}"
                if payload.get("error"):
                    line += f" — {payload['error']}"
                print(line, flush=True)
        elif event == "metrics":
            step = payload.get("step")
            if payload.get("phase") == "sft":
                if elapsed - last_sft_line[0] < SFT_LINE_SECONDS:
                    return
                last_sft_line[0] = elapsed
                parts, keys = [f"sft step {step}"], (("loss", "loss"), ("mean_token_accuracy", "token acc"),
                                                     ("learning_rate", "lr"))
            else:
                parts, keys = [f"step {step}/{total_hint}"], (
                    ("reward", "reward"), ("rewards/reward_correctness/mean", "correct"), ("loss", "loss"),
                    ("tools/call_frequency", "tool calls"), ("step_time", "step_time"))
            for key, label in keys:
                if isinstance(payload.get(key), (int, float)):
                    parts.append(f"{label}={payload[key]:.3f}")
            print(f"[{elapsed:7.1f}s] " + "  ".join(parts), flush=True)
        elif event == "evals":
            print(f"[{elapsed:7.1f}s] eval {payload.get('phase', 'grpo')} step {payload['step']} {payload['split']}: "
                  f"success={payload['success_rate']:.2f} reward={payload['avg_reward']:.3f} "
                  f"steps={payload['avg_steps']:.1f}", flush=True)
        elif event == "comparison" and payload.get("kind") == "summary":
            for who in ("random", "zero_shot", "base", "trained"):
                s = payload.get(who)
                if s:
                    ex = s.get("execution_accuracy")
                    print(f"[{elapsed:7.1f}s] {who:>9}: success={s['success_rate']:.2f} "
                          f"EX={'-' if ex is None else f'{ex:.2f}'} "
                          f"reward={s['avg_reward']:.3f} steps={s['avg_steps']:.1f}", flush=True)

    return listener


def main(argv: list[str] | None = None) -> int:
    parser = _ArgumentParser(prog="python -m training.train",
                             description="Train a model on SQLEnv with GRPO; writes runs/<run_id>/.")
    parser.add_argument("--config", help="a TrainConfig JSON file (e.g. configs/tiny_cpu.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config field (repeatable), e.g. --set max_steps=20")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue a stopped, failed or interrupted run from its last checkpoint (its own config)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.resume and (args.config or args.overrides):
        print("python -m training.train: error: --resume uses the run's own config.json: drop --config/--set",
              file=sys.stderr)
        return 2
    try:
        if args.resume:
            if not (Path(args.resume) / "config.json").is_file():
                raise ConfigError(f"--resume {args.resume}: not a run directory (no config.json)")
            from training.train import check_resumable  # loads torch: only a resume needs it here

            config = TrainConfig.from_dict(RunDir(Path(args.resume)).read_config())
            check_resumable(RunDir(Path(args.resume)))
        else:
            config = TrainConfig.from_json(args.config) if args.config else TrainConfig()
            config = config.with_overrides(args.overrides)
        from training.plan import check_config

        check_config(config)  # the dataset, TRL's checks, trackers: a bad argument, before anything is loaded
    except (ConfigError, ValueError) as exc:
        print(f"python -m training.train: error: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        import transformers

        import datasets

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()  # loading and saving weights; progress lines say enough
        datasets.disable_progress_bars()  # the warm start's dataset preparation; progress lines say enough
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from training.train import resume_training, run_training

    listener = None if args.quiet or not is_main_process() else progress_listener(config.max_steps)
    try:
        if args.resume:
            run_dir = resume_training(args.resume, listener=listener)
        else:
            run_dir = run_training(config, listener=listener)
    except FileExistsError as exc:  # a taken run_id/output_dir is a bad argument: nothing was written
        print(f"python -m training.train: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run marked failed", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the run is marked failed; say why in one line
        print(f"python -m training.train: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if is_main_process():
        status = RunDir(run_dir).read_status()
        print(json.dumps({"run_dir": str(run_dir), "status": status.get("status")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
