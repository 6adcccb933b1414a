"""Multi-turn decoding: the decoder that keeps each episode's KV cache vs the one that re-reads every conversation.

    nice python bench/decoder.py                                  # SmolLM2-135M, the issue's workload (~15 min)
    python bench/decoder.py --model builtin:tiny --episodes 4     # a quick check

Two workloads, each played by both decoders side by side in this one process, on the same model and episodes:

- **eval**: `--episodes` (16) zero-shot greedy episodes of the built-in eval split (step budget 5, 96-token turns),
  through `play_model_episodes` — what evals, traces and the comparison run. The greedy outputs must be identical.
- **rollout**: one GRPO step's rollouts (`--episodes` rows: `--episodes / 4` train questions x 4 generations, sampled
  at temperature 1, `--completion` tokens per episode) through the real `BatchedRollout` of a real GRPOTrainer.

Beside them, a KV cache kept by hand over the same rows: their first prompts read once (left-padded), then one
token per row per step for as many tokens as the episodes generated per row — the machine's own decoding rate, with
no turns, tool results or rows that end early.

Figures per workload and decoder: generated tokens, tokens fed to the model (every real token of every forward
call, counted by a forward hook on the model, so both decoders are counted alike), fed per generated, seconds,
generated tokens/s. Targets (issue 29): the new decoder feeds <= 2 tokens per token generated, generates >= 2.5x
the old decoder's tokens/s and >= 0.8x the hand-kept cache's; greedy outputs identical. The last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def log(message: str) -> None:
    print(message, flush=True)


class FeedCounter:
    """Counts real (unpadded) input tokens and forward calls of a model, whoever calls it."""

    def __init__(self, model):
        self.fed = 0
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        mask = kwargs.get("attention_mask")
        width = ids.shape[1]
        self.fed += int(mask[:, -width:].sum()) if mask is not None else int(ids.numel())
        self.calls += 1

    def reset(self) -> None:
        self.fed, self.calls = 0, 0


def generated_tokens(episodes) -> int:
    return sum(sum(e.env_mask) for e in episodes)


def hand_kept_cache(model, prompts: list[list[int]], pad_id: int, tokens_per_row: int) -> dict:
    """Prefill `prompts` once (left-padded) into a `DynamicCache`, then decode `tokens_per_row` greedy tokens per row,
    every row every step: the machine's own rate."""
    import torch
    from transformers import DynamicCache

    from training.generation.decoding import _left_padded

    input_ids, mask = _left_padded(prompts, pad_id, "cpu")
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        start = time.perf_counter()
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1, :]
        prefilled = time.perf_counter()
        position = positions[:, -1:] + 1
        for _ in range(tokens_per_row - 1):
            token = logits.argmax(-1, keepdim=True)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = model(input_ids=token, attention_mask=mask, position_ids=position, cache=cache,
                           use_cache=True).logits[:, -1, :]
            position = position + 1
        end = time.perf_counter()
    generated = len(prompts) * tokens_per_row
    return {"rows": len(prompts), "tokens_per_row": tokens_per_row, "generated": generated,
            "prompt_tokens": sum(len(p) for p in prompts), "prefill_s": round(prefilled - start, 2),
            "seconds": round(end - start, 2), "tokens_per_s": round(generated / (end - start), 1),
            "decode_tokens_per_s": round(generated / max(end - prefilled, 1e-9), 1)}


def figures(generated: int, seconds: float, counter: FeedCounter) -> dict:
    return {"generated": generated, "fed": counter.fed, "forward_calls": counter.calls,
            "fed_per_generated": round(counter.fed / max(generated, 1), 2), "seconds": round(seconds, 1),
            "tokens_per_s": round(generated / max(seconds, 1e-9), 1)}


def eval_workload(model, tokenizer, n: int, step_budget: int, turn_tokens: int, counter: FeedCounter) -> dict:
    from sqlenv.data.datasets import resolve_dataset
    from sqlenv.environment import SQLEnvironment
    from training.generation.chat import ChatRenderer
    from training.generation.model_policy import play_model_episodes

    info = resolve_dataset("builtin")
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False})
    out: dict = {}
    played = {}
    for name, keep in (("old", False), ("new", True)):
        envs = [SQLEnvironment.from_dataset(info, "eval", step_budget=step_budget) for _ in range(n)]
        observations = [env.reset(seed=i) for i, env in enumerate(envs)]
        counter.reset()
        start = time.perf_counter()
        episodes = play_model_episodes(model, tokenizer, envs, observations, max_turn_tokens=turn_tokens,
                                       renderer=renderer, keep_cache=keep)
        out[name] = figures(generated_tokens(episodes), time.perf_counter() - start, counter)
        played[name] = episodes
        for env in envs:
            env.close()
        log(f"eval, {name} decoder: {out[name]}")
    same = sum(a.completion_ids == b.completion_ids for a, b in zip(played["old"], played["new"]))
    out["identical_episodes"] = f"{same}/{n}"
    out["identical"] = same == n
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    per_row = max(1, round(out["new"]["generated"] / n))
    out["hand_kept"] = hand_kept_cache(model, [e.prompt_ids for e in played["new"]], pad, per_row)
    log(f"eval, hand-kept cache: {out['hand_kept']}")
    return out


def rollout_workload(model, tokenizer, n: int, step_budget: int, turn_tokens: int, completion: int,
                     counter: FeedCounter) -> dict:
    import torch

    from training.config import TrainConfig
    from training.grpo import build_trainer
    from training.grpo.rollout import BatchedRollout

    config = TrainConfig(dataset="builtin", rollout="rollout_func", step_budget=step_budget, num_generations=4,
                         per_device_train_batch_size=n, max_steps=1, max_turn_tokens=turn_tokens,
                         max_completion_length=completion, sft=False, device="cpu", precision="fp32",
                         temperature=1.0, beta=0.0)
    out: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        trainer = build_trainer(config, model, tokenizer, output_dir=scratch)
        rows = trainer.train_dataset
        prompts = [rows[(i // 4) % len(rows)]["prompt"] for i in range(n)]
        renderer = trainer.rollout_func.renderer  # the run's own (TRL's training template, as build_trainer sets it)
        source = trainer.rollout_func.source
        played = {}
        for name, keep in (("old", False), ("new", True)):
            rollout = BatchedRollout(source, max_turn_tokens=turn_tokens, renderer=renderer, keep_cache=keep)
            torch.manual_seed(0)
            counter.reset()
            start = time.perf_counter()
            record = rollout(prompts, trainer)
            seconds = time.perf_counter() - start
            out[name] = figures(sum(sum(mask) for mask in record["env_mask"]), seconds, counter)
            played[name] = record
            log(f"rollout, {name} decoder: {out[name]}")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        per_row = max(1, round(out["new"]["generated"] / n))
        out["hand_kept"] = hand_kept_cache(model, played["new"]["prompt_ids"], pad, per_row)
        log(f"rollout, hand-kept cache: {out['hand_kept']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), builtin:tiny, a path")
    parser.add_argument("--episodes", type=int, default=16, help="rows of each workload (default 16)")
    parser.add_argument("--step-budget", type=int, default=5)
    parser.add_argument("--turn-tokens", type=int, default=96)
    parser.add_argument("--completion", type=int, default=400, help="a rollout's token budget (default 400)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--skip-rollout", action="store_true", help="only the eval workload")
    parser.add_argument("--skip-eval", action="store_true", help="only the rollout workload")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    from training.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu", dtype="fp32")
    model.eval()
    counter = FeedCounter(model)
    result: dict = {"model": args.model, "episodes": args.episodes, "step_budget": args.step_budget,
                    "turn_tokens": args.turn_tokens, "threads": args.threads}
    if not args.skip_eval:
        result["eval"] = eval_workload(model, tokenizer, args.episodes, args.step_budget, args.turn_tokens, counter)
    if not args.skip_rollout:
        result["rollout"] = rollout_workload(model, tokenizer, args.episodes, args.step_budget, args.turn_tokens,
                                             args.completion, counter)
    for workload in ("eval", "rollout"):
        if workload not in result:
            continue
        w = result[workload]
        w["speedup"] = round(w["new"]["tokens_per_s"] / max(w["old"]["tokens_per_s"], 1e-9), 2)
        w["of_hand_kept"] = round(w["new"]["tokens_per_s"] / max(w["hand_kept"]["tokens_per_s"], 1e-9), 2)
        log(f"{workload}: new/old {w['speedup']}x, new/hand-kept {w['of_hand_kept']}, fed per generated "
            f"{w['old']['fed_per_generated']} -> {w['new']['fed_per_generated']}")
    checks = {}
    if "eval" in result:
        checks.update({"eval_fed_per_generated<=2": result["eval"]["new"]["fed_per_generated"] <= 2,
                       "eval_speedup>=2.5": result["eval"]["speedup"] >= 2.5,
                       "eval_of_hand_kept>=0.8": result["eval"]["of_hand_kept"] >= 0.8,
                       "greedy_identical": result["eval"]["identical"]})
    if "rollout" in result:
        checks.update({"rollout_fed_per_generated<=2": result["rollout"]["new"]["fed_per_generated"] <= 2,
                       "rollout_speedup>=2.5": result["rollout"]["speedup"] >= 2.5,
                       "rollout_of_hand_kept>=0.8": result["rollout"]["of_hand_kept"] >= 0.8})
    result["checks"] = checks
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
