"""The teacher's episodes, played through the environment exactly as a model plays it (`SQLEnvTRL`), as chat
conversations: what the warm start imitates (`training.warm_start`) and what the built-in tiny model's tokenizer is
trained on (`training.models`). The teacher is the oracle, except on a share of the episodes where it makes the
mistakes an untrained agent makes (`teacher_plan`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from training.config import DEFAULT_TEACHER_MISTAKES
from training.environment.source import EpisodeSource
from training.environment.trl_env import SQLEnvTRL, tool_methods, train_rows

__all__ = ["DEFAULT_MISTAKES", "teacher_plan", "teacher_conversations"]

#: The mistakes the imperfect teacher makes, by `sqlenv.evaluation.policies.MISTAKES` name (`TrainConfig.sft`'s
#: default).
DEFAULT_MISTAKES = DEFAULT_TEACHER_MISTAKES


def teacher_plan(n: int, error_rate: float = 0.0, mistakes: tuple[str, ...] | list[str] = DEFAULT_MISTAKES,
                 seed: int = 0) -> list[str]:
    """Who plays each of `n` episodes: "oracle", or the name of a mistake (`sqlenv.evaluation.policies.MISTAKES`).

    Exactly `round(error_rate * n)` episodes are imperfect; which ones, and which mistake each makes (uniformly
    among `mistakes`), is drawn from `seed` alone, so the same arguments always give the same plan.
    """
    import random

    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be between 0 and 1, got {error_rate}")
    if error_rate > 0:
        from sqlenv.evaluation.policies import MISTAKES

        unknown = [m for m in mistakes if m not in MISTAKES]
        if unknown or not mistakes:
            raise ValueError(f"unknown teacher mistakes {unknown or list(mistakes)}; known: {sorted(MISTAKES)}")
    rng = random.Random(f"teacher-{seed}")
    plan = ["oracle"] * n
    for index in sorted(rng.sample(range(n), round(error_rate * n))):
        plan[index] = rng.choice(list(mistakes))
    return plan


def teacher_conversations(
    dataset: Any = "builtin",
    split: str = "train",
    *,
    step_budget: int = 10,
    episodes: int | None = None,
    describe: bool = True,
    error_rate: float = 0.0,
    mistakes: tuple[str, ...] | list[str] = DEFAULT_MISTAKES,
    seed: int = 0,
    prompt: str = "full",
    held_out: tuple[str, ...] | frozenset[str] = (),
    tidy_sql: bool = False,
    sample_values: bool = False,
    at_most: int | None = None,
) -> list[dict[str, Any]]:
    """Play the teacher through `SQLEnvTRL` and return each episode as `{"messages", "tools", "question_id",
    "teacher"}`. `dataset` is a name, a prepared directory or a resolved `DatasetInfo`.

    The teacher is the oracle (`sqlenv.evaluation.policies.OraclePolicy`), except on the share `error_rate` of the
    episodes (`teacher_plan`) where it makes one of `mistakes`: "guess" answers without looking, "wrong_query" queries
    with a wrong filter or column and answers from that, "query_fix" queries with a column from the wrong place, reads
    the error and fixes the query (`sqlenv.evaluation.policies`). `error_rate=0` gives exactly the oracle's episodes.
    `teacher` names who played the episode. `describe`, `tidy_sql` and `sample_values` are the oracle's
    (`OraclePolicy`), and the query fixer's, which plays the oracle's episode around its mistake.

    A turn the teacher plays as a deliberate mistake not to imitate (the query fixer's broken query, its
    `mistake_turns`) carries `"trained": False`: the warm start leaves it out of the loss (`examples.episode_example`).

    `messages` is what GRPO's tool loop would have built had the model played the teacher's moves: the train
    row's prompt with `reset()`'s text appended to its user turn, then per action an assistant turn with one tool
    call and the tool's result, then `FINAL_MESSAGE`. Tool-call arguments are stored as JSON text (the Qwen3
    template writes strings verbatim), which renders identically to a dict and keeps the rows Arrow-friendly.
    `tools` holds the tool schemas as JSON text, in TRL's order, or JSON `null` with a prompt that renders none
    (`prompt="compact"`: the system prompt names the tools). With `episodes` larger than the split, questions
    repeat (a seeded shuffle decides which); smaller takes a seeded sample. `at_most` caps the default (one per
    question) the same way: a warm start of a few steps plays only the episodes it will see.
    """
    import random

    from sqlenv.evaluation.policies import MISTAKES, OraclePolicy
    from sqlenv.agent.prompts import FINAL_MESSAGE, action_to_tool_call, renders_tool_schemas, system_prompt
    from transformers.utils import get_json_schema

    source = EpisodeSource.from_dataset(dataset, split, step_budget, held_out=held_out)
    env = SQLEnvTRL(source)
    tools = [get_json_schema(method) for method in tool_methods(env)] if renders_tool_schemas(prompt) else None
    tools_json = json.dumps(tools, ensure_ascii=False)
    rows = train_rows(source, system_prompt=system_prompt(prompt)).to_list()
    order = list(range(len(rows)))
    if episodes is None and at_most is not None and at_most < len(rows):
        episodes = at_most
    if episodes is not None:
        rng = random.Random(seed)
        order = []
        while len(order) < episodes:
            block = list(range(len(rows)))
            rng.shuffle(block)
            order += block
        order = sorted(order[:episodes]) if episodes <= len(rows) else order[:episodes]
    plan = teacher_plan(len(order), error_rate, mistakes, seed)
    options = dict(describe=describe, tidy_sql=tidy_sql, sample_values=sample_values)
    oracle = OraclePolicy(**options)
    policies = {name: cls(seed=seed, **options) if issubclass(cls, OraclePolicy) else cls(seed=seed)
                for name, cls in MISTAKES.items() if name in plan}
    conversations = []
    for index, who in zip(order, plan):
        row = rows[index]
        text = env.reset(**row)
        messages = copy.deepcopy(row["prompt"])
        messages[-1]["content"] = messages[-1]["content"] + text
        inner = env.environment
        teacher = policies.get(who, oracle)
        teacher.reset(inner, env.observation)
        mistakes_at = set(getattr(teacher, "mistake_turns", ()))
        turn = 0
        while not env.done:
            action = teacher.act(inner, env.observation)
            call = action_to_tool_call(action)
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            result = getattr(env, name)(**arguments)
            call["function"]["arguments"] = json.dumps(arguments, ensure_ascii=False)
            message = {"role": "assistant", "content": "", "tool_calls": [call]}
            if turn in mistakes_at:
                message["trained"] = False
            messages.append(message)
            turn += 1
            messages.append({"role": "tool", "name": name, "content": str(result)})
        messages.append({"role": "assistant", "content": FINAL_MESSAGE})
        conversations.append({"messages": messages, "tools": tools_json, "question_id": row["question_id"],
                              "teacher": who})
    return conversations
