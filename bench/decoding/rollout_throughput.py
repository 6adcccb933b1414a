"""Rollout throughput: batched `rollout_func` vs one episode at a time, same 32 episodes, tiny model.

    python bench/decoding/rollout_throughput.py [--episodes 32] [--step-budget 3] [--turn-tokens 32] [--model DIR]

Both sides call the real `training.grpo.rollout.BatchedRollout` through a real GRPOTrainer (rollout path): once with
all episodes in one call (one `generate` per turn for every live episode), once per episode. Same prompts, same
model, same generation settings. Prints episodes/s of both, the ratio (target >= 4x), and generated tokens
(so unequal episode lengths would show). The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--step-budget", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--model", default="builtin:tiny",
                        help="builtin:tiny (default, untrained) or a run's final/ (e.g. after SFT: realistic turns)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1, as training uses)")
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch
    import transformers

    torch.set_num_threads(args.threads)

    transformers.logging.set_verbosity_error()
    from training.config import TrainConfig
    from training.models import load_model_and_tokenizer
    from training.grpo import build_trainer

    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu")
    config = TrainConfig(
        dataset=args.dataset, rollout="rollout_func", step_budget=args.step_budget, num_generations=2,
        per_device_train_batch_size=2, max_steps=1, max_turn_tokens=args.turn_tokens,
        max_completion_length=args.step_budget * (args.turn_tokens + 200), sft=False, device="cpu",
        precision="fp32",
    )
    with tempfile.TemporaryDirectory() as scratch:
        trainer = build_trainer(config, model, tokenizer, output_dir=scratch)
        rows = trainer.train_dataset
        prompts = [rows[i % len(rows)]["prompt"] for i in range(args.episodes)]

        def timed(batches: list[list]) -> tuple[float, int]:
            torch.manual_seed(0)
            start = time.perf_counter()
            tokens = 0
            for batch in batches:
                out = trainer.rollout_func(batch, trainer)
                tokens += sum(sum(mask) for mask in out["env_mask"])
            return time.perf_counter() - start, tokens

        timed([prompts])  # warm-up: the environment pool and caches, as in a running trainer
        batched_s, batched_tokens = timed([prompts])
        single_s, single_tokens = timed([[p] for p in prompts])
    n = args.episodes
    batched_eps, single_eps = n / batched_s, n / single_s
    print(f"model: {args.model}  episodes: {n}  step budget: {args.step_budget}  turn tokens: {args.turn_tokens}  "
          f"threads: {torch.get_num_threads()}")
    print(f"one at a time: {single_eps:8.2f} episodes/s  ({single_s:.1f} s, {single_tokens} generated tokens)")
    print(f"batched      : {batched_eps:8.2f} episodes/s  ({batched_s:.1f} s, {batched_tokens} generated tokens)")
    print(f"ratio        : {batched_eps / single_eps:8.2f}x  (target >= 4x)")
    print(json.dumps({"episodes": n, "single_eps_per_s": round(single_eps, 3),
                      "batched_eps_per_s": round(batched_eps, 3), "ratio": round(batched_eps / single_eps, 2),
                      "single_tokens": single_tokens, "batched_tokens": batched_tokens}))


if __name__ == "__main__":
    main()
