"""One GRPO step on the CPU, before and after issue 56: prefill, decoding, tools and loss, side by side.

    nice python bench/learning/cpu_step.py --threads 1                        # spider10 and the built-in recipe
    nice python bench/learning/cpu_step.py --recipes spider10 --init runs/ws/warm_start   # from a warm start
    python bench/learning/cpu_step.py --model builtin:tiny --recipes builtin --groups 2 --turn-tokens 16 \\
        --completion 64                                                       # CI's smallest form (seconds)

Each recipe (`spider10`: `configs/smollm2_spider10_cpu.json`, needs Spider; `builtin`: `configs/smollm2_cpu.json`)
plays one generation batch of its shape — `--groups` train questions (default: the recipe's batch / its
generations, 4) x its `num_generations`, sampled at its temperature, its turn and episode caps — twice in this one
process, on the same model and questions:

- **old**: fp32, `MultiTurnDecoder` reading only the prefix every row shares (`share_groups=False`): the CPU step
  before;
- **new**: the run's precision as `precision: auto` resolves it on this CPU (`--precision` forces one: bf16 on a CPU
  without bf16 units runs, emulated, several times slower), the decoder `kept_cache_decoder` picks for it (bf16:
  the graph decoder's bf16 weight copies, eager), each group's prompt read once.

Per setting: seconds of prefill and of decoding (the decoder's `DecodeStats`), of everything else in the play (the
tools, rendering and parsing: `tools_s`), generated tokens/s; then the loss's forward and backward over the **same
episodes** (the old setting's), one row per micro-batch as the recipes train, in fp32 and under the new setting's
autocast: seconds for every row and for the rows the lean loss keeps (non-zero advantage); and the mean gap between
the log-probabilities the new setting's decoder sampled its tokens with and those its loss computes for them
(target <= 1e-2). `step_speedup` is old over new (rollout + kept rows' loss); issue 56's target is >= 3x on
spider10, which needs a CPU with bf16 units (`bf16_units` says whether this one has them). The last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spinning threads on a shared machine

RECIPES = {"spider10": REPO / "configs" / "smollm2_spider10_cpu.json", "builtin": REPO / "configs" / "smollm2_cpu.json"}


def log(message: str) -> None:
    print(message, flush=True)


def play(model, renderer, source, question_ids: list[str], config, decoder) -> tuple[list, float]:
    """One generation batch: an episode per question id, played as `BatchedRollout` plays them; returns the
    episodes and the play's wall seconds."""
    from sqlenv.agent.prompts import initial_messages
    from training.generation.episodes import Episode, play_batched

    envs = [source.environment() for _ in question_ids]
    try:
        episodes = []
        for env, question_id in zip(envs, question_ids):
            observation = env.reset(question_id=question_id)
            messages = initial_messages(observation, config.prompt)

            def step(action, env=env):
                from sqlenv.agent.prompts import format_tool_result

                obs = env.step(action)
                return format_tool_result(obs), obs, obs.done

            episodes.append(Episode(messages=messages, prompt_ids=renderer.prompt_ids(messages), step=step,
                                    observation=observation))
        start = time.perf_counter()
        play_batched(model, renderer, episodes, max_turn_tokens=config.max_turn_tokens,
                     max_completion_tokens=config.max_completion_length, max_turns=config.step_budget + 2,
                     sample=True, temperature=config.temperature, decoder=decoder)
        return episodes, time.perf_counter() - start
    finally:
        for env in envs:
            env.close()


def advantages(episodes, generations: int) -> list[float]:
    """Dr. GRPO's advantage of each episode: its success less its group's mean (the recipes' reward is success)."""
    rewards = [float(e.observation.reward or 0.0) > 0.5 for e in episodes]
    out = []
    for start in range(0, len(rewards), generations):
        group = rewards[start: start + generations]
        mean = sum(group) / len(group)
        out += [r - mean for r in group]
    return out


def row_logprobs(model, episode, temperature: float, dtype) -> tuple:
    """(log-probabilities of the episode's completion tokens, with grad), under autocast at `dtype` (None: fp32)."""
    import contextlib

    import torch

    ids = torch.tensor([episode.prompt_ids + episode.completion_ids])
    autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with autocast:
        logits = model(input_ids=ids, logits_to_keep=len(episode.completion_ids) + 1).logits[0, :-1]
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logps.gather(1, torch.tensor(episode.completion_ids)[:, None]).squeeze(1)


def loss_seconds(model, episodes, advantage: list[float], temperature: float, dtype) -> dict:
    """Forward and backward of each row alone (one row per micro-batch, as the recipes train): seconds for every
    row with a model token, and for the rows the lean loss keeps."""
    import torch

    model.train()
    every, kept, rows = 0.0, 0.0, 0
    for episode, adv in zip(episodes, advantage):
        mask = torch.tensor(episode.env_mask, dtype=torch.float32)
        if not mask.any():
            continue
        start = time.perf_counter()
        logps = row_logprobs(model, episode, temperature, dtype)
        loss = -((adv or 1.0) * logps * mask).sum() / mask.sum()
        loss.backward()
        seconds = time.perf_counter() - start
        every += seconds
        rows += 1
        if adv != 0:
            kept += seconds
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"rows": rows, "rows_kept": sum(1 for a in advantage if a != 0), "every_row_s": round(every, 2),
            "kept_rows_s": round(kept, 2)}


def logprob_gap(model, episodes, temperature: float, dtype) -> float | None:
    """Mean |sampled log-prob - the loss's log-prob| over the model's sampled tokens."""
    import torch

    gaps = []
    with torch.no_grad():
        for episode in episodes:
            sampled = [i for i, m in enumerate(episode.env_mask) if m]
            if not sampled or len(sampled) != len(episode.sampled_logprobs):
                continue  # a turn closed at its cap has an end token the model did not sample
            scored = row_logprobs(model, episode, temperature, dtype)[sampled].tolist()
            gaps += [abs(a - b) for a, b in zip(episode.sampled_logprobs, scored)]
    return round(sum(gaps) / len(gaps), 6) if gaps else None


def run_recipe(name: str, args, model, tokenizer) -> dict:
    import random

    import torch

    from training.config import TrainConfig
    from training.generation.chat import ChatRenderer
    from training.generation.decoders import decode_dtype, kept_cache_decoder
    from training.generation.multi_turn import MultiTurnDecoder
    from training.plan import RunPlan, resolve_precision

    overrides = {"model": args.model, "sft": False, "output_dir": str(Path(args.scratch) / name)}
    for key in ("max_turn_tokens", "max_completion_length"):
        value = getattr(args, {"max_turn_tokens": "turn_tokens", "max_completion_length": "completion"}[key])
        if value:
            overrides[key] = value
    config = TrainConfig.from_json(RECIPES[name]).with_overrides(overrides)
    plan = RunPlan.resolve(config)
    source = plan.episodes("train")
    generations = config.num_generations
    groups = args.groups or max(1, config.per_device_train_batch_size * config.gradient_accumulation_steps
                                // generations)
    questions = random.Random(args.seed).sample([q.question_id for q in source.questions], groups)
    question_ids = [q for q in questions for _ in range(generations)]
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": config.enable_thinking},
                            prompt=config.prompt)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = set(renderer.eos_token_ids)
    precision = args.precision or resolve_precision("auto", "cpu")
    new_dtype = decode_dtype(precision, model)
    settings = {
        "old": (MultiTurnDecoder(model, pad, eos, share_groups=False), None),
        "new": (kept_cache_decoder(model, pad, eos, compute_dtype=new_dtype), new_dtype),
    }
    out: dict = {"config": str(RECIPES[name].relative_to(REPO)), "rows": len(question_ids), "groups": groups,
                 "new_precision": precision, "new_decoder": type(settings["new"][0]).__name__}
    played = {}
    warm_up = renderer.prompt_ids([{"role": "user", "content": "warm up"}])
    for decoder, _ in settings.values():  # first calls allocate: neither setting pays for it in its figures
        decoder.generate({0: warm_up, 1: warm_up}, 2)
        decoder.stats = type(decoder.stats)()
    for label, (decoder, _) in settings.items():
        torch.manual_seed(args.seed)
        episodes, seconds = play(model, renderer, source, question_ids, config, decoder)
        stats = decoder.stats
        generated = sum(sum(e.env_mask) for e in episodes)
        out[label] = {"rollout_s": round(seconds, 2), "prefill_s": round(stats.prefill_seconds, 2),
                      "decode_s": round(stats.decode_seconds, 2),
                      "tools_s": round(seconds - stats.prefill_seconds - stats.decode_seconds, 2),
                      "generated": generated, "fed": stats.fed,
                      "tokens_per_s": round(generated / max(seconds, 1e-9), 1),
                      "success": sum(float(e.observation.reward or 0) > 0.5 for e in episodes) / len(episodes)}
        played[label] = episodes
        log(f"{name}, {label} rollout: {out[label]}")
    episodes = played["old"]  # the loss on the same episodes, both ways
    advantage = advantages(episodes, generations)
    out["prompt_tokens_per_row"] = round(sum(len(e.prompt_ids) for e in episodes) / len(episodes), 1)
    out["completion_tokens_per_row"] = round(sum(len(e.completion_ids) for e in episodes) / len(episodes), 1)
    for label, (_, dtype) in settings.items():
        out[label]["loss"] = loss_seconds(model, episodes, advantage, config.temperature, dtype)
        out[label]["logprob_gap"] = logprob_gap(model, played[label], config.temperature, dtype)
        log(f"{name}, {label} loss: {out[label]['loss']}, log-prob gap {out[label]['logprob_gap']}")
    step = {label: out[label]["rollout_s"] + out[label]["loss"]["kept_rows_s"] for label in settings}
    out["step_s"] = {label: round(s, 2) for label, s in step.items()}
    out["step_speedup"] = round(step["old"] / max(step["new"], 1e-9), 2)
    out["rollout_tokens_per_s_ratio"] = round(out["new"]["tokens_per_s"] / max(out["old"]["tokens_per_s"], 1e-9), 2)
    log(f"{name}: step old {step['old']:.1f} s, new {step['new']:.1f} s: {out['step_speedup']}x")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), builtin:tiny, a path")
    parser.add_argument("--init", help="a saved model to load instead (a warm start's folder)")
    parser.add_argument("--recipes", default="spider10,builtin", help="comma-separated: spider10, builtin")
    parser.add_argument("--groups", type=int, help="questions in the batch (default: the recipe's batch)")
    parser.add_argument("--turn-tokens", type=int, help="max_turn_tokens (default: the recipe's)")
    parser.add_argument("--completion", type=int, help="max_completion_length (default: the recipe's)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), help="the new setting's (default: auto's answer)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if not recipes or not set(recipes) <= set(RECIPES):
        parser.error(f"--recipes takes some of {', '.join(RECIPES)} (got {args.recipes!r})")
    for flag in ("groups", "turn_tokens", "completion", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import tempfile

    import torch
    import transformers

    from training.models import load_model_and_tokenizer
    from training.device import cpu_has_bf16_units

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.init or args.model, device="cpu", dtype="fp32")
    model.eval()
    result: dict = {"bench": "cpu_step", "model": args.init or args.model, "threads": args.threads,
                    "bf16_units": cpu_has_bf16_units()}
    with tempfile.TemporaryDirectory(prefix="sqlenv-cpu-step-") as scratch:
        args.scratch = scratch
        for name in recipes:
            result[name] = run_recipe(name, args, model, tokenizer)
    result["checks"] = {f"{name}_logprob_gap<=1e-2": (result[name]["new"]["logprob_gap"] or 0) <= 1e-2
                        for name in recipes}
    if "spider10" in result:
        result["checks"]["spider10_step_speedup>=3"] = result["spider10"]["step_speedup"] >= 3
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
