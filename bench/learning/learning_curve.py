"""Learning curve of the dashboard's default run — random, warm start, GRPO — beside the clean-oracle reference.

    nice python bench/learning/learning_curve.py                     # configs/tiny_cpu.json, built-in data, targets
    nice python bench/learning/learning_curve.py --dataset spider10  # the same recipe on spider10: honest figures
    nice python bench/learning/learning_curve.py --set max_steps=40  # any TrainConfig field, as `training.train` takes
    nice python bench/learning/learning_curve.py --no-reference      # skip the clean-oracle reference run
    nice python bench/learning/learning_curve.py --no-reference --record  # keep the default run's figures (the picker)

It runs exactly what the dashboard's Start button runs with the form's defaults: `training.train.run_training` on
`configs/tiny_cpu.json`, in fresh data and runs folders, so the built-in data, the tokenizer and the tiny model are
built on the way as on a fresh checkout, and the minutes are all-in. Then, as a reference measured by the same
code, the same run with a clean-oracle warm start (`sft.teacher_error_rate=0`).

The figures come from the run directories: the comparison summary (the random policy, the warm start as `base`
when GRPO starts, the trained model when it ends: greedy episodes on the same eval questions, `comparison_episodes`
of them), the GRPO reward of `metrics.jsonl` (mean of the first and of the last fifth of the steps) and the curve
of `evals.jsonl`. Targets on the built-in data, idle 2-core machine: all-in <= 10 minutes; final eval success
>= 60% on >= 200 episodes; random ~0%; GRPO raises eval success by >= 15 points; the GRPO reward rises. The last
line printed is one JSON object with the figures.

With `--record` the default run's figures (success and EX at each stage, eval questions, minutes, peak memory,
seconds per phase, this command, the machine's load before and during the run) go into `configs/measured.json` under
the config's name, with a digest of the config: the Train form's cost line for that config shows them
(`dashboard.core.measured`). A `--record` refuses to start while other work loads the machine (a newcomer's minutes are
an idle machine's), unless `--shared` says to record anyway; then, or when other work starts during the run, the
entry says the cores were shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
DEFAULT_CONFIG = REPO / "configs" / "tiny_cpu.json"

from bench.learning.meters import (  # noqa: E402 - after the path
    MemoryMeter, PhaseClock, grpo_rewards, machine_load, refuse_shared, reward_fifths)


def log(message: str) -> None:
    print(message, flush=True)


def run_once(config, label: str) -> dict:
    """Train `config` through the dashboard's entry point; the figures read back from its run directory, with the
    wall seconds of each phase, this process's peak memory and the machine's load while it ran."""
    from training.run.directory import RunDir
    from training.cli import progress_listener
    from training.train import run_training

    log(f"--- {label}: {config.run_id}")
    memory = MemoryMeter()
    printer = progress_listener(config.max_steps)
    clock = PhaseClock(lambda phase: setattr(memory, "phase", phase))

    def listener(event: str, payload: dict) -> None:
        printer(event, payload)
        clock(event, payload)

    load_before = machine_load()
    memory.start()
    start = time.perf_counter()
    try:
        run = RunDir(run_training(config, listener=listener))
    finally:
        clock.enter(None)
        memory.stop()
    minutes = (time.perf_counter() - start) / 60
    status = run.read_status()
    if status.get("status") != "completed":
        raise RuntimeError(f"{label} run ended {status.get('status')}: {status.get('error')}")
    summary = next(r for r in reversed(run.read("comparison")) if r.get("kind") == "summary")
    first_fifth, last_fifth = reward_fifths(grpo_rewards(run))
    evals = run.read("evals")
    t0 = min((e["time"] for e in evals), default=0.0)
    return {
        "random": summary["random"], "base": summary["base"], "trained": summary["trained"],
        "n_episodes": summary["n_episodes"],
        "reward_first_fifth": first_fifth,
        "reward_last_fifth": last_fifth,
        "sft_seconds": status.get("sft", {}).get("seconds"),
        "minutes": round(minutes, 2),
        "curve": [{"phase": e.get("phase"), "step": e["step"], "split": e["split"], "minutes": round((e["time"] - t0) / 60, 2),
                   "success": e["success_rate"], "explored": e.get("explore_rate")} for e in evals],
        "run_dir": str(run.path), "device": status.get("device"),
        "phase_seconds": {k: round(v, 1) for k, v in clock.seconds.items()},
        "peak_memory_gb": round(memory.peak, 2), "disk_written_gb": round(memory.written_gb(), 2),
        "mean_load": memory.mean_load(), "load_before": load_before,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="builtin", help="builtin (default, with targets) or spider10 (no target)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the recipe (default configs/tiny_cpu.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a TrainConfig field of both runs, e.g. --set max_steps=40")
    parser.add_argument("--no-reference", action="store_true", help="skip the clean-oracle reference run")
    parser.add_argument("--record", action="store_true",
                        help="write the default run's figures into configs/measured.json under the config's file "
                             "name, with this command and a digest of the config (the Train form's cost line); the "
                             "config must run as it is: no --set, the built-in dataset")
    parser.add_argument("--note", default=None, help="with --record: a remark kept in the entry")
    parser.add_argument("--shared", action="store_true",
                        help="with --record: record even though other work loads the machine (refused otherwise); "
                             "the entry says the cores were shared")
    args = parser.parse_args(argv)
    if args.record and (args.overrides or args.dataset != "builtin"):
        print("learning_curve: --record measures a config file as it is: drop --set and --dataset", file=sys.stderr)
        return 2
    if args.record and args.config.resolve().parent != (REPO / "configs").resolve():
        print(f"learning_curve: --record keeps figures for the configs under configs/, not {args.config}",
              file=sys.stderr)
        return 2
    refusal = refuse_shared(args.shared) if args.record else None
    if refusal:
        print(f"learning_curve: {refusal}", file=sys.stderr)
        return 2
    from dashboard.core.measured import config_digest

    digest = config_digest(args.config)  # the config as it runs, before any edit

    # Fresh folders: the data, the tokenizer and the model are built on the way, as on a first press of Start.
    scratch = Path(tempfile.mkdtemp(prefix="sqlenv-curve-"))
    os.environ["SQLENV_RUNS_DIR"] = str(scratch / "runs")
    os.environ["SQLENV_DATA_DIR"] = str(scratch / "data")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import warnings

    warnings.filterwarnings("ignore")
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    from training.config import ConfigError, TrainConfig

    if args.dataset != "builtin":
        prepared = _prepare(args.dataset)
        if prepared is not None:
            print(f"learning_curve: {prepared}", file=sys.stderr)
            return 2
    try:
        config = TrainConfig.from_json(args.config).with_overrides([f"dataset={args.dataset}", *args.overrides])
    except ConfigError as exc:
        print(f"learning_curve: {exc}", file=sys.stderr)
        return 2
    out: dict = {"dataset": args.dataset, "config": str(args.config), "overrides": args.overrides,
                 "teacher_error_rate": config.resolved_sft().teacher_error_rate}
    default = run_once(config.with_overrides({"run_id": "default"}), "the default recipe")
    if args.record:
        from bench.learning.meters import command_line, measurement
        from dashboard.core.measured import record

        entry = measurement(config, default["run_dir"], device=default["device"], minutes=default["minutes"],
                            command=command_line("bench/learning/learning_curve.py", argv),
                            phase_seconds=default["phase_seconds"], peak_memory_gb=default["peak_memory_gb"],
                            disk_written_gb=default["disk_written_gb"], mean_load=default["mean_load"],
                            load_before=default["load_before"], note=args.note)
        log(f"recorded in {record(args.config, entry, digest)}")
    out.update({
        "random_eval_success": default["random"]["success_rate"],
        "sft_eval_success": default["base"]["success_rate"],
        "grpo_eval_success": default["trained"]["success_rate"],
        "grpo_minus_sft_points": round(100 * (default["trained"]["success_rate"] - default["base"]["success_rate"]), 1),
        # execution accuracy (EX) on the same episodes: the last successful QUERY returned the gold result
        "random_eval_execution": default["random"].get("execution_accuracy"),
        "sft_eval_execution": default["base"].get("execution_accuracy"),
        "grpo_eval_execution": default["trained"].get("execution_accuracy"),
        "sft_explore_rate": default["base"].get("explore_rate"),
        "grpo_explore_rate": default["trained"].get("explore_rate"),
        "n_eval_episodes": default["n_episodes"],
        "reward_first_fifth": default["reward_first_fifth"],
        "reward_last_fifth": default["reward_last_fifth"],
        "sft_seconds": default["sft_seconds"],
        "minutes": default["minutes"],
        "curve": default["curve"],
    })
    if not args.no_reference:
        clean = run_once(config.with_overrides({"run_id": "clean-reference", "sft.teacher_error_rate": 0.0}),
                         "reference: clean-oracle warm start")
        out.update({
            "clean_sft_eval_success": clean["base"]["success_rate"],
            "clean_grpo_eval_success": clean["trained"]["success_rate"],
            "clean_grpo_minus_sft_points": round(
                100 * (clean["trained"]["success_rate"] - clean["base"]["success_rate"]), 1),
            "reference_minutes": clean["minutes"],
        })
    if args.dataset == "builtin":
        out["targets"] = {
            "minutes<=10": out["minutes"] <= 10,
            "grpo_eval_success>=0.60": out["grpo_eval_success"] >= 0.60,
            "n_eval_episodes>=200": out["n_eval_episodes"] >= 200,
            "random~0": out["random_eval_success"] <= 0.02,
            "grpo_minus_sft>=15_points": out["grpo_minus_sft_points"] >= 15.0,
            "reward_rises": (out["reward_last_fifth"] or 0) > (out["reward_first_fifth"] or 0),
        }
    log(f"random {out['random_eval_success']:.3f} | warm start {out['sft_eval_success']:.3f} | after GRPO "
        f"{out['grpo_eval_success']:.3f} ({out['grpo_minus_sft_points']:+.1f} points) on {out['n_eval_episodes']} "
        f"eval episodes | reward {out['reward_first_fifth']:.3f} -> {out['reward_last_fifth']:.3f} | "
        f"{out['minutes']:.2f} min all-in")
    if "clean_sft_eval_success" in out:
        log(f"reference, clean-oracle warm start: {out['clean_sft_eval_success']:.3f} -> after GRPO "
            f"{out['clean_grpo_eval_success']:.3f} ({out['clean_grpo_minus_sft_points']:+.1f} points)")
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(out))
    return 0


def _prepare(name: str) -> str | None:
    """Prepare `name` (spider10 from the local Spider copy) unless it exists; a message when it cannot be had."""
    from sqlenv.data.datasets import DatasetNotFoundError, data_root, resolve_dataset

    try:
        resolve_dataset(name)
        return None
    except DatasetNotFoundError as exc:
        if name != "spider10":
            return str(exc)
        from sqlenv.data.spider import default_spider_dir, prepare_spider

        source = default_spider_dir()
        if not (source / "tables.json").exists():
            return f"{exc}; no Spider copy at {source} to prepare it from (set SQLENV_SPIDER_DIR)"
        prepare_spider(source, data_root() / "spider10", preset="spider10")
        return None


if __name__ == "__main__":
    raise SystemExit(main())
