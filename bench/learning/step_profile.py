"""Where a training step of `builtin:tiny` spends its time on CPU, before and after this project's changes.

    nice python bench/learning/step_profile.py               # one SFT step and one GRPO step, each both ways
    nice python bench/learning/step_profile.py --warm-start  # also the whole warm start, before vs after, eval success
    python bench/learning/step_profile.py --sft-steps 2 --sft-episodes 8 --grpo-steps 1 --rounds 1 \\
        --set num_generations=2 --set per_device_train_batch_size=2 --set step_budget=2 --set max_turn_tokens=16
                                                              # CI's smallest form (the same steps, seconds)

SFT: TRL's `SFTTrainer` (its fused, chunked LM head scores every position and recomputes the head in the backward
pass; on CPU that runs as plain torch ops) against `training.warm_start.trainer.WarmStartTrainer` (the LM head only at the
trained positions), on the same model, data and batches. GRPO: the default recipe's step (`rollout_func`, 64
completions) with TRL's default `gradient_checkpointing=True` — what every run paid before `TrainConfig`'s `False`
reached `GRPOConfig` — against `False`. Each pair runs interleaved (A, B, A, B) in this one process, so both see the
same machine; per-step times are medians after a warm-up. For each it prints where the time goes (cProfile: the
top-level phases of the step).

`--warm-start` adds the whole warm start side by side: the one `bench/learning/learning_curve.py` ran before (TRL's
`SFTTrainer`, 5000 steps of 4 oracle episodes, lr 3e-3, 2 threads) against the default recipe's
(`configs/tiny_cpu.json`: `WarmStartTrainer`, its steps, batch and threads), both on the clean oracle so their
eval success compares: seconds, and greedy success on the same eval episodes. The last line printed is one JSON
object with the figures.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spinning threads on a shared machine
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def log(message: str) -> None:
    print(message, flush=True)


class StepTimer:
    """A TrainerCallback recording each optimizer step's wall time (steps after `warmup`; in a run of `steps` steps,
    no more than `warmup`, its last step)."""

    def __init__(self, warmup: int = 3, steps: int | None = None):
        from transformers import TrainerCallback

        if steps is not None:
            warmup = min(warmup, steps - 1)
        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.begin = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step > warmup:
                    timer.seconds.append(time.perf_counter() - timer.begin)

        self.begin = 0.0
        self.seconds: list[float] = []
        self.callback = _Callback()

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.seconds)


def phases(profile: cProfile.Profile, names: dict[str, tuple[str, str]], steps: int) -> dict[str, float]:
    """Milliseconds per step spent in each function of `names` ({label: (file name ending, function name)}),
    cumulative; where several match (an override and the method it wraps), the outermost one counts."""
    stats = pstats.Stats(profile).stats
    out = {}
    for label, (path, name) in names.items():
        times = [entry[3] for (file, _, function), entry in stats.items() if function == name and file.endswith(path)]
        out[label] = round(1000 * max(times, default=0.0) / steps, 1)
    return out


def sft_steps(model, tokenizer, conversations, trainer_class, steps: int, profile: bool) -> tuple[float, dict]:
    from training.warm_start import SFTSettings, run_sft

    timer = StepTimer(steps=steps)
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    run_sft(copy.deepcopy(model), tokenizer, SFTSettings(max_steps=steps, batch_size=4, logging_steps=10_000),
            conversations=conversations, callbacks=[timer.callback], trainer_class=trainer_class)
    split = {}
    if profiler:
        profiler.disable()
        split = phases(profiler, {"forward + loss": ("sft_trainer.py", "compute_loss"),
                                  "backward": ("torch/_tensor.py", "backward"),
                                  "optimizer": ("accelerate/optimizer.py", "step")}, steps)
    return timer.median_ms, split


def grpo_steps(model, tokenizer, checkpointing: bool, steps: int, profile: bool,
               overrides: list[str] = ()) -> tuple[float, dict]:
    from training.config import TrainConfig
    from training.grpo import build_trainer

    config = TrainConfig.from_json(REPO / "configs" / "tiny_cpu.json").with_overrides(list(overrides)).with_overrides(
        {"max_steps": steps, "sft": False, "gradient_checkpointing": checkpointing, "save_steps": 0,
         "output_dir": tempfile.mkdtemp(prefix="sqlenv-profile-")})
    timer = StepTimer(warmup=1, steps=steps)
    trainer = build_trainer(config, copy.deepcopy(model), tokenizer, callbacks=[timer.callback],
                            output_dir=config.output_dir)
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    trainer.train()
    split = {}
    if profiler:
        profiler.disable()
        split = phases(profiler, {"rollouts (generation + environment)": ("training/generation/episodes.py", "play_batched"),
                                  "log-probs + loss (forward)": ("grpo_trainer.py", "_compute_loss"),
                                  "backward": ("torch/_tensor.py", "backward")}, steps)
    return timer.median_ms, split


def warm_start(model, tokenizer, threads: int, trainer_class, settings, eval_episodes: int) -> dict:
    """One whole warm start of a copy of `model` with `settings` on the clean oracle: seconds (episodes prepared
    and trained) and its greedy eval success."""
    import dataclasses

    import torch

    from training.generation.model_policy import evaluate_model
    from training.warm_start import run_sft

    settings = dataclasses.replace(settings, teacher_error_rate=0.0, logging_steps=10_000)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fresh = copy.deepcopy(model)
        result = run_sft(fresh, tokenizer, settings, trainer_class=trainer_class)
        success = evaluate_model(fresh, tokenizer, dataset="builtin", split="eval", n_episodes=eval_episodes,
                                 seed=0, step_budget=10, max_turn_tokens=64, batch_size=64).success_rate
    finally:
        torch.set_num_threads(before)
    return {"seconds": round(result.seconds, 1), "steps": result.steps, "batch": settings.batch_size,
            "schedule": settings.args.get("lr_scheduler_type", settings.lr_scheduler_type), "threads": threads,
            "trainer": trainer_class.__name__, "eval_success": success, "eval_episodes": eval_episodes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft-steps", type=int, default=60, help="SFT steps per measurement (default 60)")
    parser.add_argument("--grpo-steps", type=int, default=4, help="GRPO steps per measurement (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds, interleaved (default 2)")
    parser.add_argument("--warm-start", action="store_true", help="also time both whole warm starts (~12 minutes)")
    parser.add_argument("--eval-episodes", type=int, default=400, help="eval episodes per warm start (default 400)")
    parser.add_argument("--sft-episodes", type=int, default=None,
                        help="teacher episodes the SFT steps draw from (default: one per train question)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change the GRPO step's recipe (configs/tiny_cpu.json), e.g. num_generations=2")
    args = parser.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    import datasets
    import torch
    from transformers.utils import logging as hf_logging
    from trl import SFTTrainer

    from training.config import TrainConfig
    from training.models import load_model_and_tokenizer
    from training.warm_start import SFTSettings, teacher_conversations
    from training.warm_start.trainer import WarmStartTrainer

    hf_logging.set_verbosity_error()
    datasets.disable_progress_bars()
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer("builtin:tiny", device="cpu")
    conversations = teacher_conversations("builtin", "train", describe=False, episodes=args.sft_episodes)
    out: dict = {"threads": 1}

    log("SFT step, batch of 4 episodes, 1 thread: TRL SFTTrainer vs WarmStartTrainer")
    sft = {"SFTTrainer": [], "WarmStartTrainer": []}
    for round_ in range(args.rounds):
        for cls in (SFTTrainer, WarmStartTrainer):
            ms, split = sft_steps(model, tokenizer, conversations, cls, args.sft_steps, profile=round_ == 0)
            sft[cls.__name__].append(ms)
            log(f"  {cls.__name__:17s} {ms:6.1f} ms/step" + (f"   per step: {split}" if split else ""))
            if split:
                out.setdefault("sft_split_ms", {})[cls.__name__] = split
    out["sft_step_ms"] = {k: round(statistics.median(v), 1) for k, v in sft.items()}
    out["sft_step_speedup"] = round(out["sft_step_ms"]["SFTTrainer"] / out["sft_step_ms"]["WarmStartTrainer"], 2)
    log(f"  -> {out['sft_step_speedup']}x")

    log("GRPO step of the default recipe (64 completions, rollout_func), 1 thread: gradient checkpointing on vs off")
    warm, _ = load_model_and_tokenizer("builtin:tiny", device="cpu")
    grpo = {"checkpointing on (TRL default)": [], "checkpointing off": []}
    for round_ in range(args.rounds):
        for label, flag in (("checkpointing on (TRL default)", True), ("checkpointing off", False)):
            ms, split = grpo_steps(warm, tokenizer, flag, args.grpo_steps, profile=round_ == 0,
                                   overrides=args.overrides)
            grpo[label].append(ms)
            log(f"  {label:31s} {ms:7.1f} ms/step" + (f"   per step: {split}" if split else ""))
            if split:
                out.setdefault("grpo_split_ms", {})[label] = split
    out["grpo_step_ms"] = {k: round(statistics.median(v), 1) for k, v in grpo.items()}

    if args.warm_start:
        recipe = TrainConfig.from_json(REPO / "configs" / "tiny_cpu.json")
        log("Whole warm start on the clean oracle: before (TRL SFTTrainer, 5000 x 4, cosine, 2 threads) vs the default "
            "recipe's")
        old = SFTSettings(max_steps=5000, batch_size=4, learning_rate=3e-3, describe=False)
        before = warm_start(model, tokenizer, 2, SFTTrainer, old, args.eval_episodes)
        log(f"  before: {before}")
        from training.device import resolve_cpu_threads

        after = warm_start(model, tokenizer, resolve_cpu_threads(recipe), WarmStartTrainer,
                           SFTSettings.from_config(recipe), args.eval_episodes)
        log(f"  after:  {after}")
        out["warm_start"] = {"before": before, "after": after,
                             "speedup": round(before["seconds"] / after["seconds"], 2)}
        log(f"  -> {out['warm_start']['speedup']}x faster, eval success {before['eval_success']:.3f} -> "
            f"{after['eval_success']:.3f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
