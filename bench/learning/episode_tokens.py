"""What a recipe's model reads and writes, in its own tokens: the prompt (full vs compact) and the teacher's episodes.

    python bench/learning/episode_tokens.py --config configs/smollm2_cpu.json      # SmolLM2-135M's tokenizer (~1 min)
    python bench/learning/episode_tokens.py --model builtin:tiny --episodes 200     # a quick check

- **prompt**: the tokens of an episode's prompt (system prompt, tool schemas when the prompt renders them, first user
  turn, generation prompt) for each prompt of `sqlenv.agent.prompts.PROMPTS`, over `--questions` train questions.
- **teacher**: the warm start's teacher episodes (`training.warm_start.teacher_conversations` with the config's step
  budget, `describe` and teacher settings), rendered as a rollout records them: the completion is every assistant
  turn and the tool results between them, up to the end of the answering turn (the batched rollout stops there).
  Its p50/p90/p99/max, the longest turn's, and whether the config's `max_completion_length` and `max_turn_tokens`
  cover the p99 (the caps a recipe should be sized from: an episode cut by the cap has no outcome to learn from).
  Each tool's turns apart, and how many ANSWER turns exceed each turn cap: an answer longer than `max_turn_tokens`
  cannot be handed back whole, however right the query (`--split eval`: the eval questions that cap shuts out).

    python bench/learning/episode_tokens.py --config configs/smollm2_spider10_cpu.json --split eval

Loads the tokenizer only (for a GGUF model, from the file, ~10 s). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def load_tokenizer(model: str):
    """The tokenizer a run of `model` renders with (a GGUF model's from its file, with TRL's tool template)."""
    from training.models.gguf import is_gguf_model, load_gguf_tokenizer

    if is_gguf_model(model):
        return load_gguf_tokenizer(model)
    from training.models import load_model_and_tokenizer

    return load_model_and_tokenizer(model, device="cpu")[1]


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[int]) -> dict:
    return {"mean": round(statistics.mean(values), 1), "min": min(values), "p50": percentile(values, 0.5),
            "p90": percentile(values, 0.9), "p99": percentile(values, 0.99), "max": max(values), "n": len(values)}


def prompt_tokens(tokenizer, dataset: str, step_budget: int, questions: int) -> dict:
    from sqlenv.environment import SQLEnvironment
    from sqlenv.agent.prompts import PROMPTS, initial_messages
    from training.generation.chat import ChatRenderer

    env = SQLEnvironment.from_dataset(dataset, "train", step_budget=step_budget)
    try:
        observations = [env.reset(seed=i) for i in range(questions)]
    finally:
        env.close()
    result = {}
    for prompt in PROMPTS:
        renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt=prompt)
        result[prompt] = summary([len(renderer.prompt_ids(initial_messages(o, prompt))) for o in observations])
    return result


#: Turn caps the answer turns are counted against (`max_turn_tokens` is added): what raising the cap would let through.
ANSWER_CAPS = (160, 256, 384, 512, 768, 1024)


def teacher_tokens(tokenizer, config, episodes: int | None, split: str | None = None) -> dict:
    """The teacher's episodes on `split` (default: the warm start's own, the train split) in the model's tokens:
    completions, every turn, and each tool's turns (`by_tool`), with the answer turns over each of `ANSWER_CAPS`."""
    from training.generation.chat import ChatRenderer
    from training.warm_start import SFTSettings, teacher_conversations

    settings = SFTSettings.from_config(config)
    conversations = teacher_conversations(
        settings.dataset, split or settings.split, step_budget=settings.step_budget,
        episodes=episodes if episodes is not None else settings.episodes, describe=bool(settings.describe),
        error_rate=settings.teacher_error_rate, mistakes=settings.teacher_mistakes, seed=settings.seed,
        prompt=config.prompt, tidy_sql=settings.tidy_sql, sample_values=settings.sample_values)
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt=config.prompt)
    render = dict(chat_template=renderer.chat_template, tokenize=True, return_dict=False, enable_thinking=False)
    completions, turns, by_tool = [], [], {}
    for conversation in conversations:
        messages = conversation["messages"]
        tools = json.loads(conversation["tools"])
        prompt = renderer.prompt_ids(messages[:2])
        # Up to the answering turn: the final tool result and the closing message are not part of a rollout.
        last_call = max(i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls"))
        ids = tokenizer.apply_chat_template(messages[: last_call + 1], tools=tools, **render)
        completions.append(len(ids) - len(prompt))
        end = tokenizer.eos_token_id
        for i, message in enumerate(messages[: last_call + 1]):
            if message["role"] != "assistant":
                continue
            # The turn: from its generation prompt through its end of turn.
            start = len(tokenizer.apply_chat_template(messages[:i], tools=tools, add_generation_prompt=True, **render))
            length = ids[start:].index(end) + 1 if end in ids[start:] else len(ids) - start
            turns.append(length)
            calls = message.get("tool_calls") or [{}]
            by_tool.setdefault(calls[0].get("function", {}).get("name", "text"), []).append(length)
    answers = by_tool.get("answer", [])
    caps = sorted({*ANSWER_CAPS, config.max_turn_tokens})
    return {"episodes": len(conversations), "split": split or settings.split,
            "completion": {**summary(completions), "values": completions}, "turn": summary(turns),
            "by_tool": {name: summary(values) for name, values in sorted(by_tool.items())},
            "answers_over_cap": {str(cap): sum(1 for n in answers if n > cap) for cap in caps}}


def main(argv: list[str] | None = None) -> int:
    from training.config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="a TrainConfig JSON (model, dataset, step budget, prompt, caps, teacher)")
    parser.add_argument("--model", help="the model whose tokenizer counts (default: the config's, else smollm2-135m)")
    parser.add_argument("--questions", type=int, default=200, help="train questions for the prompt counts (200)")
    parser.add_argument("--episodes", type=int, help="teacher episodes (default: one per train question)")
    parser.add_argument("--split", help="the split the teacher plays (default: the warm start's, train); e.g. eval: "
                        "which eval answers the turn cap lets through")
    args = parser.parse_args(argv)
    config = TrainConfig.from_json(args.config) if args.config else TrainConfig(model="smollm2-135m", step_budget=5)
    model = args.model or config.model
    started = time.perf_counter()
    tokenizer = load_tokenizer(model)
    prompts = prompt_tokens(tokenizer, config.dataset, config.step_budget, args.questions)
    for name, counts in prompts.items():
        print(f"prompt {name:8s} tokens: mean {counts['mean']}, {counts['min']}..{counts['max']} over {counts['n']} "
              "questions", flush=True)
    teacher = teacher_tokens(tokenizer, config, args.episodes, args.split)
    cap, turn_cap = config.resolved_max_completion_length(), config.max_turn_tokens
    for name, values in (("completion", teacher["completion"]), ("turn", teacher["turn"]),
                         *((f"{tool} turn", v) for tool, v in teacher["by_tool"].items())):
        print(f"teacher {name:10s} tokens: p50 {values['p50']}, p90 {values['p90']}, p99 {values['p99']}, "
              f"max {values['max']} ({values['n']})", flush=True)
    over_caps = ", ".join(f"{n} over {c}" for c, n in teacher["answers_over_cap"].items())
    print(f"teacher answer turns ({teacher['split']}): {over_caps} (max_turn_tokens={turn_cap})", flush=True)
    over = teacher["completion"].pop("values")
    teacher["completion_share_over_cap"] = round(sum(1 for n in over if n > cap) / len(over), 4)
    print(f"teacher episodes over max_completion_length={cap}: {teacher['completion_share_over_cap']:.1%}", flush=True)
    result = {"model": model, "prompt_tokens": prompts, "teacher": teacher, "max_completion_length": cap,
              "max_turn_tokens": turn_cap, "completion_cap_covers_p99": cap >= teacher["completion"]["p99"],
              "turn_cap_covers_p99": turn_cap >= teacher["turn"]["p99"],
              "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
