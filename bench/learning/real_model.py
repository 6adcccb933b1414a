"""A real pretrained model through the whole pipeline: zero-shot, warm start, GRPO, on the full eval split.

    nice python bench/learning/real_model.py --config configs/smollm2_cpu.json      # CPU, built-in data (<= 15 min)
    python bench/learning/real_model.py --config configs/smollm2_spider10_gpu.json  # GPU, spider10 (the issue's target)
    python bench/learning/real_model.py --config configs/smollm2_cpu.json --episodes 4 --set max_steps=2  # quick check
    python bench/learning/real_model.py --config configs/smollm2_spider10_gpu.json --minutes 8  # in chunks: stops at a
    python bench/learning/real_model.py --resume runs/<run_id> --minutes 8                     # checkpoint, resumes
    python bench/learning/real_model.py --config configs/smollm2_cpu.json --out runs/smollm2  # rerun: resumes / reports

It runs the config through `training.train.run_training` (what the dashboard's Start and the CLI run) with the
comparison played on the whole eval split (`comparison_episodes` = its size, or `--episodes`), and reads the figures
back from the run directory: eval success of the pretrained model before any training (zero-shot), after its warm
start (when the config has one) and after GRPO, beside the random policy; the GRPO reward (mean of the first and the
last fifth of the steps); wall time per phase (from the run's status changes); generated tokens per second during
GRPO's rollouts (every `generate` call made while the GRPO phase runs, timed and counted: new tokens that are not
padding); peak GPU memory; peak resident memory (overall and per phase) and the bytes written to disk (checkpoints
included). Targets of the GPU recipe (issue 18, one H100, spider10's 203 eval questions): after
GRPO >= 30% success and >= 5 points over the warm start (or zero-shot), all-in <= 30 min, rollouts >= 5,000
generated tokens/s. The last line printed is one JSON object with the figures.

A run survives a restart: with `--out DIR` (the run's directory) the same command run again resumes the run there
from its last checkpoint when it was cut short (killed, machine restarted, stopped, failed: `resume_training`, the
run's own config), and reports a completed one without training again (so does `--resume` of a completed run). The
figures add up the chunks that ended normally; a chunk whose process was killed wrote none (its minutes, tokens and
bytes are missing: `resumes` in the figures counts every resume, `chunks` the chunks counted). `--record` measures a
run whole, so it refuses a directory that already holds one.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
DEFAULT_CONFIG = REPO / "configs" / "smollm2_cpu.json"

from bench.learning.meters import (  # noqa: E402 - after the path
    MemoryMeter, PhaseClock, command_line, grpo_rewards, machine_load, measurement, refuse_shared, reward_fifths,
    run_outcome)


def log(message: str) -> None:
    print(message, flush=True)


class GenerationMeter:
    """Counts the tokens generated, and the seconds spent generating, while `active` is set.

    It wraps the places every rollout generates through: transformers' `GenerationMixin.generate` (TRL's tool
    loop), `MultiTurnDecoder.generate` and `GraphDecoder.generate` (the batched rollout and evals: on a CPU, on a GPU)
    and `generate_new_tokens` (their re-reading fallback). Nested calls (the batched
    decoder falling back to `generate`) are counted once, by the outermost.
    """

    def __init__(self):
        self.active = threading.Event()
        self.tokens = 0
        self.seconds = 0.0
        self._depth = threading.local()

    def install(self) -> None:
        import training.generation.episodes
        from transformers.generation.utils import GenerationMixin

        import training.generation.graph_decoder
        import training.generation.multi_turn

        self._installed = [(GenerationMixin, "generate", GenerationMixin.generate),
                           (training.generation.episodes, "generate_new_tokens",
                            training.generation.episodes.generate_new_tokens)]
        GenerationMixin.generate = self._wrap(GenerationMixin.generate, self._count_generate)
        training.generation.episodes.generate_new_tokens = self._wrap(training.generation.episodes.generate_new_tokens, self._count_rows)
        for decoder in (training.generation.multi_turn.MultiTurnDecoder, training.generation.graph_decoder.GraphDecoder):
            self._installed.append((decoder, "generate", decoder.generate))
            decoder.generate = self._wrap(decoder.generate, self._count_keyed)

    def uninstall(self) -> None:
        """Put back what `install` wrapped (a process that runs the bench more than once, as a test does)."""
        for owner, name, original in reversed(getattr(self, "_installed", [])):
            setattr(owner, name, original)
        self._installed = []

    def _wrap(self, function, count):
        meter = self

        @functools.wraps(function)
        def timed(*args, **kwargs):
            depth = getattr(meter._depth, "n", 0)
            if depth or not meter.active.is_set():
                return function(*args, **kwargs)
            meter._depth.n = depth + 1
            start = time.perf_counter()
            try:
                out = function(*args, **kwargs)
            finally:
                meter._depth.n = depth
            meter.seconds += time.perf_counter() - start
            meter.tokens += count(args, kwargs, out)
            return out

        return timed

    @staticmethod
    def _count_generate(args, kwargs, out) -> int:
        model = args[0]
        sequences = getattr(out, "sequences", out)
        prompt = kwargs.get("input_ids", args[1] if len(args) > 1 else None)
        if prompt is None or not hasattr(sequences, "shape"):
            return 0
        new = sequences[:, prompt.shape[1]:]
        pad = getattr(model.generation_config, "pad_token_id", None)
        return int((new != pad).sum()) if pad is not None else int(new.numel())

    @staticmethod
    def _count_rows(args, kwargs, out) -> int:
        return sum(len(row) for row in out)

    @staticmethod
    def _count_keyed(args, kwargs, out) -> int:
        return sum(len(row) for row in out.values())


def eval_split_size(config) -> int:
    from sqlenv.data.datasets import load_questions, resolve_dataset

    info = resolve_dataset(config.dataset, data_root=config.data_dir)
    return len(load_questions(info.questions_path(config.eval_split)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="the recipe (default configs/smollm2_cpu.json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a TrainConfig field, e.g. --set max_steps=2")
    parser.add_argument("--episodes", type=int, default=None,
                        help="eval episodes of the comparison (default: the whole eval split)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop after this many minutes (at a checkpoint) and print how to resume: for "
                             "machines lent in short slices")
    parser.add_argument("--record", action="store_true",
                        help="write the figures into configs/measured.json under the config's file name, with this "
                             "command and a digest of the config (what the dashboard's picker shows before Start and "
                             "counts remaining time with); the config must run as it is: no --set")
    parser.add_argument("--note", default=None,
                        help="with --record: a remark kept in the entry (e.g. what else ran on the machine)")
    parser.add_argument("--shared", action="store_true",
                        help="with --record: record even though other work loads the machine (refused otherwise); "
                             "the entry says the cores were shared")
    parser.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                        help="continue a run this bench stopped (its own config; figures add up across chunks)")
    parser.add_argument("--out", type=Path, default=None, metavar="RUN_DIR",
                        help="the run's directory: a run there that was cut short resumes (its own config), a "
                             "completed one is reported, else the run starts there")
    args = parser.parse_args(argv)

    from bench.learning.grpo_sweep import config_differs
    from training.config import ConfigError, TrainConfig
    from training.run.directory import RunDir

    try:
        if args.record and (args.overrides or args.resume is not None):
            raise ConfigError("--record measures a config file as it is: drop --set and --resume")
        if args.record and args.config.resolve().parent != (REPO / "configs").resolve():
            raise ConfigError(f"--record keeps figures for the configs under configs/, not {args.config}")
        refusal = refuse_shared(args.shared) if args.record else None
        if refusal:
            raise ConfigError(refusal)
        if args.resume is not None and args.out is not None:
            raise ConfigError("give --resume RUN_DIR or --out RUN_DIR, not both")
        held = args.out is not None and (args.out / "status.json").is_file()
        if held and args.record:
            raise ConfigError(f"--record measures a run whole: {args.out} already holds one (choose a new --out)")
        if args.resume is not None:
            if args.overrides or args.episodes is not None:
                raise ConfigError("--resume uses the run's own config: drop --set/--episodes")
            if not (args.resume / "config.json").is_file():
                raise ConfigError(f"--resume {args.resume}: not a run directory (no config.json)")
            config = TrainConfig.from_dict(RunDir(args.resume).read_config())
            n = config.comparison_episodes
        else:
            config = TrainConfig.from_json(args.config).with_overrides(args.overrides)
            n = args.episodes if args.episodes is not None else eval_split_size(config)
            config = config.with_overrides({"comparison_episodes": n, "compare_base": True})
            if args.out is not None:
                config = config.with_overrides({"output_dir": str(args.out)})
        if held:  # the same command again: the run it started continues (resumed, or reported when it completed)
            if not (args.out / "config.json").is_file():
                raise ConfigError(f"--out {args.out}: a run directory without its config.json")
            differs = config_differs(RunDir(args.out).read_config(), config)
            if differs:
                raise ConfigError(f"--out {args.out} holds a run of another config ({', '.join(differs)}): the same "
                                  "command continues it; choose a new --out for another")
            args.resume = args.out
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"bench/learning/real_model.py: error: {exc}", file=sys.stderr)
        return 2

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    from training.cli import progress_listener
    from training.train import check_resumable, resume_training, run_training

    from dashboard.core.measured import config_digest, record

    digest = config_digest(args.config) if args.record else None  # the config as it runs, before any edit
    meter = GenerationMeter()
    meter.install()
    memory = MemoryMeter()
    load_before = machine_load()
    memory.start()
    printer = progress_listener(config.max_steps)

    def on_phase(phase: str | None) -> None:
        memory.phase = phase
        (meter.active.set if phase == "grpo" else meter.active.clear)()

    clock = PhaseClock(on_phase)

    def listener(event: str, payload: dict) -> None:
        printer(event, payload)
        clock(event, payload)

    stop = threading.Event()
    timer = threading.Timer(args.minutes * 60, stop.set) if args.minutes is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    log(f"--- {config.model} on {config.dataset}: comparison on {n} {config.eval_split} episodes")
    start = time.perf_counter()
    held = RunDir(args.resume).read_live_status().get("status") if args.resume is not None else None
    if held not in (None, "completed"):
        try:
            check_resumable(RunDir(args.resume))
        except ValueError as exc:  # still running in another process
            print(f"bench/learning/real_model.py: error: {exc}", file=sys.stderr)
            return 2
    try:
        if held == "completed":
            log(f"{args.resume} completed: its figures, not trained again")
            path = args.resume
        elif args.resume is not None:
            log(f"{args.resume} reads {held} at step {RunDir(args.resume).read_status().get('step')}: resuming it "
                "from its last checkpoint")
            path = resume_training(args.resume, stop_event=stop, listener=listener)
        else:
            log(f"run directory: {config.output_dir}" + (" (run this command again to resume it after a restart)"
                                                       if args.out is not None else ""))
            path = run_training(config, stop_event=stop, listener=listener)
    finally:
        if timer is not None:
            timer.cancel()
        clock.enter(None)
        memory.stop()
        meter.uninstall()
    run = RunDir(path)
    figures = _chunk_figures(run) if held == "completed" else _add_chunk(run, clock.seconds,
                                                                          time.perf_counter() - start, meter, memory)
    status = run.read_status()
    figures["resumes"] = int(status.get("resumes") or 0)
    if status.get("status") == "stopped" and args.minutes is not None:
        again = "run the same command again" if args.out is not None else (
            f"python bench/learning/real_model.py --resume {run.path}" + f" --minutes {args.minutes}")
        log(f"stopped after {args.minutes} minutes at a checkpoint; continue with: {again}")
        return 0
    if status.get("status") != "completed":
        print(f"bench/learning/real_model.py: run ended {status.get('status')}: {status.get('error')}", file=sys.stderr)
        return 1
    summary = next(r for r in reversed(run.read("comparison")) if r.get("kind") == "summary")
    rewards = grpo_rewards(run)
    first_fifth, last_fifth = reward_fifths(rewards)

    def success(key: str) -> float | None:
        return summary[key]["success_rate"] if summary.get(key) else None

    warm = bool(config.resolved_sft().enabled)
    result = {
        "model": config.model, "dataset": config.dataset, "device": status.get("device"),
        "n_parameters": status.get("n_parameters"), "eval_split": config.eval_split, "eval_episodes": n,
        "random": success("random"),
        "zero_shot": success("zero_shot") if warm else success("base"),
        "warm_start": success("base") if warm else None,
        "after_grpo": success("trained"),
        "grpo_steps": len(rewards),
        "reward_first_fifth": round(first_fifth, 4) if first_fifth is not None else None,
        "reward_last_fifth": round(last_fifth, 4) if last_fifth is not None else None,
        **run_outcome(run.path),
        **figures,
        "run_dir": str(run.path),
    }
    if args.record:
        entry = measurement(config, run.path, device=status.get("device"), minutes=figures["total_seconds"] / 60,
                            command=command_line("bench/learning/real_model.py", argv),
                            phase_seconds=figures["phase_seconds"], peak_memory_gb=figures["peak_rss_gb"],
                            disk_written_gb=figures["disk_written_gb"],
                            mean_load=memory.mean_load(), load_before=load_before, note=args.note)
        log(f"recorded in {record(args.config, entry, digest)}")
    log(json.dumps(result))
    return 0


BENCH_FILE = "bench_real_model.json"


def _add_chunk(run, phases: dict[str, float], seconds: float, meter: GenerationMeter, memory: MemoryMeter) -> dict:
    """This invocation's times and token counts added to those of earlier chunks of the same run (kept in the run
    directory), as the figures to report."""
    import torch

    from training.run.directory import atomic_write_json

    path = run.file(BENCH_FILE)
    kept = json.loads(path.read_text()) if path.is_file() else {}
    total = dict(kept.get("phase_seconds", {}))
    for phase, value in phases.items():
        total[phase] = round(total.get(phase, 0.0) + value, 1)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    kept = {
        "phase_seconds": total,
        "total_seconds": round(kept.get("total_seconds", 0.0) + seconds, 1),
        "chunks": kept.get("chunks", 0) + 1,
        "rollout_generated_tokens": kept.get("rollout_generated_tokens", 0) + meter.tokens,
        "rollout_generate_seconds": round(kept.get("rollout_generate_seconds", 0.0) + meter.seconds, 2),
        "peak_gpu_memory_gb": None if peak is None else round(max(peak, kept.get("peak_gpu_memory_gb") or 0.0), 2),
        "peak_rss_gb": round(max(memory.peak, kept.get("peak_rss_gb") or 0.0), 2),
        "peak_rss_gb_by_phase": {phase: round(max(value, kept.get("peak_rss_gb_by_phase", {}).get(phase, 0.0)), 2)
                                 for phase, value in {**kept.get("peak_rss_gb_by_phase", {}),
                                                      **memory.peak_by_phase}.items()},
        "disk_written_gb": round(kept.get("disk_written_gb", 0.0) + memory.written_gb(), 2),
    }
    atomic_write_json(path, kept)
    return _chunk_figures(run)


def _chunk_figures(run) -> dict:
    """The figures kept in the run directory (the chunks counted so far), with the rollouts' tokens per second."""
    path = run.file(BENCH_FILE)
    kept = json.loads(path.read_text()) if path.is_file() else {}
    seconds_generating = kept.get("rollout_generate_seconds") or 0.0
    return {**kept, "rollout_tokens_per_s": round(kept["rollout_generated_tokens"] / seconds_generating, 1)
            if seconds_generating > 0 else None}


if __name__ == "__main__":
    sys.exit(main())
