"""Multi-turn decoding: the decoder that keeps each episode's KV cache vs the one that re-reads every conversation.

    nice python bench/decoding/decoder.py                                # SmolLM2-135M, the issue's workload (~15 min)
    python bench/decoding/decoder.py --model builtin:tiny --episodes 4   # a quick check
    python bench/decoding/decoder.py --decoders new,graph --threads 1    # the two kept-cache decoders only

Two workloads, each played by three decoders side by side in this one process, on the same model and episodes: the
re-reading decoder ("old"), `MultiTurnDecoder` ("new"), and the graph decoder ("graph", `GraphDecoder`: on a CPU its
step runs eagerly, so this compares the two kept-cache decoders where the CPU default is chosen):

- **eval**: `--episodes` (16) zero-shot greedy episodes of the built-in eval split (step budget 5, 96-token turns),
  through `play_model_episodes` — what evals, traces and the comparison run. The greedy outputs must be identical.
- **rollout**: one GRPO step's rollouts (`--episodes` rows: `--episodes / 4` train questions x 4 generations, sampled
  at temperature 1, `--completion` tokens per episode) through the real `BatchedRollout` of a real GRPOTrainer.

Beside them, a KV cache kept by hand over the same rows: their first prompts read once (left-padded), then one
token per row per step for as many tokens as the episodes generated per row — the machine's own decoding rate, with
no turns, tool results or rows that end early.

Figures per workload and decoder: generated tokens, tokens fed to the model (every real token of every forward
call, counted by a forward hook on the model, so both decoders are counted alike), fed per generated, seconds,
generated tokens/s (`graph_vs_new`: the graph decoder's rate over the new one's). Targets (issue 29): the new
decoder feeds <= 2 tokens per token generated, generates >= 2.5x the old decoder's tokens/s and >= 0.8x the
hand-kept cache's; greedy outputs identical (the graph decoder's too). The last line printed is one JSON object.
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


def figures(generated: int, seconds: float, counter: FeedCounter, decoder=None) -> dict:
    """The workload's figures; the graph decoder runs the model's modules without its forward (the counter sees
    nothing), so its own counts are read."""
    fed, calls = counter.fed, counter.calls
    if decoder is not None and not calls:
        fed, calls = decoder.stats.fed, decoder.stats.forward_calls
    return {"generated": generated, "fed": fed, "forward_calls": calls,
            "fed_per_generated": round(fed / max(generated, 1), 2), "seconds": round(seconds, 1),
            "tokens_per_s": round(generated / max(seconds, 1e-9), 1)}


#: The decoders compared: (name, keep the cache, which kept-cache decoder).
DECODERS = (("old", False, None), ("new", True, "kept"), ("graph", True, "graph"))


def eval_workload(model, tokenizer, n: int, step_budget: int, turn_tokens: int, counter: FeedCounter,
                  decoders: tuple[str, ...]) -> dict:
    from sqlenv.data.datasets import resolve_dataset
    from sqlenv.environment import SQLEnvironment
    from training.generation.chat import ChatRenderer
    from training.generation.model_policy import play_model_episodes

    from training.generation.decoders import kept_cache_decoder

    info = resolve_dataset("builtin")
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: dict = {}
    played = {}
    for name, keep, kind in (d for d in DECODERS if d[0] in decoders):
        envs = [SQLEnvironment.from_dataset(info, "eval", step_budget=step_budget) for _ in range(n)]
        observations = [env.reset(seed=i) for i, env in enumerate(envs)]
        decoder = kept_cache_decoder(model, pad, set(renderer.eos_token_ids), kind=kind) if keep else None
        counter.reset()
        start = time.perf_counter()
        episodes = play_model_episodes(model, tokenizer, envs, observations, max_turn_tokens=turn_tokens,
                                       renderer=renderer, keep_cache=keep, decoder=decoder)
        out[name] = figures(generated_tokens(episodes), time.perf_counter() - start, counter, decoder)
        played[name] = episodes
        for env in envs:
            env.close()
        log(f"eval, {name} decoder: {out[name]}")
    for label, a, b in (("", "old", "new"), ("graph_", "new", "graph")):
        if a in played and b in played:
            same = sum(x.completion_ids == y.completion_ids for x, y in zip(played[a], played[b]))
            out[f"{label}identical_episodes"] = f"{same}/{n}"
            out[f"{label}identical"] = same == n
    kept = played.get("new") or next(iter(played.values()))
    per_row = max(1, round(generated_tokens(kept) / n))
    out["hand_kept"] = hand_kept_cache(model, [e.prompt_ids for e in kept], pad, per_row)
    log(f"eval, hand-kept cache: {out['hand_kept']}")
    return out


def rollout_workload(model, tokenizer, n: int, step_budget: int, turn_tokens: int, completion: int,
                     counter: FeedCounter, decoders: tuple[str, ...]) -> dict:
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
        # Every generated token counts here, those of an episode cut by the completion budget too (training masks
        # them out of the loss: counted from the mask, a budget every episode reaches measured 0 tokens).
        trainer.args.mask_truncated_completions = False
        rows = trainer.train_dataset
        prompts = [rows[(i // 4) % len(rows)]["prompt"] for i in range(n)]
        renderer = trainer.rollout_func.renderer  # the run's own (TRL's training template, as build_trainer sets it)
        source = trainer.rollout_func.source
        played = {}
        for name, keep, kind in (d for d in DECODERS if d[0] in decoders):
            os.environ["SQLENV_DECODER"] = kind or "auto"  # the rollout makes its own decoder
            rollout = BatchedRollout(source, max_turn_tokens=turn_tokens, renderer=renderer, keep_cache=keep)
            torch.manual_seed(0)
            counter.reset()
            start = time.perf_counter()
            record = rollout(prompts, trainer)
            seconds = time.perf_counter() - start
            decoder = rollout.decoder(trainer.model, trainer) if keep else None
            out[name] = figures(sum(sum(mask) for mask in record["env_mask"]), seconds, counter, decoder)
            os.environ.pop("SQLENV_DECODER")
            played[name] = record
            log(f"rollout, {name} decoder: {out[name]}")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        kept = "new" if "new" in out else next(iter(out))
        per_row = max(1, round(out[kept]["generated"] / n))
        out["hand_kept"] = hand_kept_cache(model, played[kept]["prompt_ids"], pad, per_row)
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
    parser.add_argument("--decoders", default="old,new,graph", help="which decoders play, comma-separated "
                        "(default old,new,graph)")
    args = parser.parse_args(argv)
    decoders = tuple(d.strip() for d in args.decoders.split(",") if d.strip())
    if not decoders or not set(decoders) <= {name for name, _, _ in DECODERS}:
        parser.error(f"--decoders takes some of old,new,graph (got {args.decoders!r})")
    if args.episodes < 1 or (not args.skip_rollout and args.episodes % 4):
        parser.error(f"--episodes must be positive, and a multiple of 4 for the rollout workload (its groups of 4 "
                     f"generations; got {args.episodes}; --skip-rollout plays any number)")
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
        result["eval"] = eval_workload(model, tokenizer, args.episodes, args.step_budget, args.turn_tokens, counter,
                                       decoders)
    if not args.skip_rollout:
        result["rollout"] = rollout_workload(model, tokenizer, args.episodes, args.step_budget, args.turn_tokens,
                                             args.completion, counter, decoders)

    def ratio(w: dict, a: str, b: str) -> float | None:
        return round(w[a]["tokens_per_s"] / max(w[b]["tokens_per_s"], 1e-9), 2) if a in w and b in w else None

    checks = {}
    for workload in ("eval", "rollout"):
        if workload not in result:
            continue
        w = result[workload]
        w["speedup"], w["graph_vs_new"] = ratio(w, "new", "old"), ratio(w, "graph", "new")
        w["of_hand_kept"] = ratio(w, "new", "hand_kept")
        log(f"{workload}: new/old {w['speedup']}x, new/hand-kept {w['of_hand_kept']}, graph/new "
            f"{w['graph_vs_new']}x")
        if "new" in w:
            checks[f"{workload}_fed_per_generated<=2"] = w["new"]["fed_per_generated"] <= 2
            checks[f"{workload}_of_hand_kept>=0.8"] = w["of_hand_kept"] >= 0.8
        if w["speedup"] is not None:
            checks[f"{workload}_speedup>=2.5"] = w["speedup"] >= 2.5
    for key in ("identical", "graph_identical"):
        if key in result.get("eval", {}):
            checks[f"greedy_{key}"] = result["eval"][key]
    result["checks"] = checks
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
