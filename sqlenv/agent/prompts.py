"""What a language-model agent reads: the system prompt, the first user turn, tool results, and the context budget.

Plain text and the standard library, so both layers use it: training (GRPO, SFT, evals) and `sqlenv`'s own
policies for models behind an endpoint (`sqlenv.evaluation.openai_policy`). One place renders every piece of text
the policy sees, so GRPO (both rollout paths), SFT warm-start, evals and
the dashboard's traces all show the model the same conversation:

    messages = initial_messages(env.reset(question_id=qid))      # [system, user]
    ... assistant turn with a tool call (see `action_to_tool_call`) ...
    {"role": "tool", "name": "query", "content": format_tool_result(obs)}
    ... after ANSWER the tool result says the episode is over; the model ends with FINAL_MESSAGE.

Two prompts (`PROMPTS`, chosen by `TrainConfig.prompt`): `"full"` (default), the short `SYSTEM_PROMPT` after
which the chat template renders the four tools' JSON schemas; `"compact"`, for small models, `COMPACT_SYSTEM_PROMPT`
names the tools and the call format in three lines and no schemas are rendered (`renders_tool_schemas`). Measured
with SmolLM2-135M's tokenizer (TRL's Qwen3 template), an episode's prompt takes 552 tokens full and 190 compact
(means over 200 built-in train questions): the schemas are ~400 of the full one's, read (and back-propagated) in
every row of every GRPO step. The model's tool calls are the same `<tool_call>` JSON either way, parsed by the
template's response schema or `sqlenv.agent.model_output.parse_model_output`.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlenv.types import SQLAction, SQLObservation

__all__ = [
    "SYSTEM_PROMPT",
    "COMPACT_SYSTEM_PROMPT",
    "PROMPTS",
    "system_prompt",
    "renders_tool_schemas",
    "FINAL_MESSAGE",
    "MAX_OBSERVATION_CHARS",
    "TOOL_FOR_ACTION",
    "first_user_message",
    "initial_messages",
    "format_tool_result",
    "action_to_tool_call",
    "tool_call_to_action",
    "cut",
    "fit_context",
]

SYSTEM_PROMPT = (
    "You answer a question about a SQLite database. Call one tool per turn: describe tables, query, then answer.\n"
    "Answer formats: one value; a list as a, b, c; table rows as a | b, one row per line; [] if empty."
)

#: The compact prompt (`PROMPTS["compact"]`): the tools and the call format in the system prompt itself, and no tool
#: schemas rendered by the chat template. The example call is what the template renders for a tool call.
COMPACT_SYSTEM_PROMPT = (
    "You answer a question about a SQLite database. Call one tool per turn: describe tables, query, then answer.\n"
    "Tools: describe(table_name) shows a table's columns; sample(table_name) its first rows; query(sql) runs one "
    "SELECT; answer(value) submits the answer and ends the episode.\n"
    'Call a tool as <tool_call>\n{"name": "query", "arguments": {"sql": "SELECT ..."}}\n</tool_call>\n'
    "Answer formats: one value; a list as a, b, c; table rows as a | b, one row per line; [] if empty."
)

#: The prompts a run may choose (`TrainConfig.prompt`), by name: the system prompt, and whether the chat template
#: renders the tool schemas after it.
PROMPTS: dict[str, tuple[str, bool]] = {
    "full": (SYSTEM_PROMPT, True),
    "compact": (COMPACT_SYSTEM_PROMPT, False),
}


def _prompt(name: str) -> tuple[str, bool]:
    if name not in PROMPTS:
        raise ValueError(f"unknown prompt {name!r}: use one of {list(PROMPTS)}")
    return PROMPTS[name]


def system_prompt(prompt: str = "full") -> str:
    """The system prompt of `prompt` (`"full"` or `"compact"`, see `PROMPTS`)."""
    return _prompt(prompt)[0]


def renders_tool_schemas(prompt: str = "full") -> bool:
    """Whether the chat template renders the tools' JSON schemas after the system prompt of `prompt` (`"full"`); the
    compact prompt names the tools itself."""
    return _prompt(prompt)[1]


#: What the model says after the answer tool's result: a turn without a tool call ends TRL's tool loop.
FINAL_MESSAGE = "Done."

#: Long tool results are cut to this many characters (the environment cuts at the same size).
MAX_OBSERVATION_CHARS = 2000

#: action type -> (tool name, argument name) of `training.environment.trl_env.SQLEnvTRL`'s tools.
TOOL_FOR_ACTION = {
    "DESCRIBE": ("describe", "table_name"),
    "SAMPLE": ("sample", "table_name"),
    "QUERY": ("query", "sql"),
    "ANSWER": ("answer", "value"),
}
_ACTION_FOR_TOOL = {tool: action for action, (tool, _) in TOOL_FOR_ACTION.items()}

_EPISODE_OVER = "Episode over. Reply without a tool call."


def cut(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    """`text` cut to `limit` characters with a marker saying how much was left out."""
    if len(text) <= limit:
        return text
    marker = f"\n... ({len(text) - limit} more characters cut)"
    return text[: max(0, limit - len(marker))] + marker


def first_user_message(observation: SQLObservation) -> str:
    """The first user turn: the question, the table names and the step budget."""
    schema = observation.schema_info.strip() or "Tables: (none)"
    return (
        f"Question: {observation.question.strip()}\n"
        f"{cut(schema)}\n"
        f"You have {observation.budget_remaining} steps."
    )


def initial_messages(observation: SQLObservation, prompt: str = "full") -> list[dict[str, Any]]:
    """`[system, user]` for an episode that just started: what GRPO's prompt plus `reset()` render to. `prompt` names
    the system prompt (`PROMPTS`; default `"full"`)."""
    return [
        {"role": "system", "content": system_prompt(prompt)},
        {"role": "user", "content": first_user_message(observation)},
    ]


def format_tool_result(observation: SQLObservation) -> str:
    """The text a tool call returns: the result or the error, the steps left, or that the episode is over."""
    if observation.error:
        body = f"Error: {observation.error.strip()}"
    else:
        body = observation.result.strip() or "(no output)"
    body = cut(body)
    if observation.done:
        return f"{body}\n{_EPISODE_OVER}"
    left = observation.budget_remaining
    return f"{body}\n[{left} step{'s' if left != 1 else ''} left]"


def episode_over_message() -> str:
    """The tool result of a call made after the episode ended (it also costs a small penalty)."""
    return f"Error: the episode is over, nothing was run. {_EPISODE_OVER}"


def action_to_tool_call(action: SQLAction) -> dict[str, Any]:
    """An `SQLAction` as a chat-template tool call, e.g. `{"type": "function", "function": {"name": "query", ...}}`."""
    kind = action.action_type.strip().upper()
    if kind not in TOOL_FOR_ACTION:
        raise ValueError(f"no tool for action type {action.action_type!r}")
    name, arg = TOOL_FOR_ACTION[kind]
    return {"type": "function", "function": {"name": name, "arguments": {arg: action.argument}}}


def tool_call_to_action(name: str, arguments: Any) -> SQLAction:
    """A parsed tool call as an `SQLAction` (unknown tool names become unknown action types: an error step)."""
    kind = _ACTION_FOR_TOOL.get(str(name).strip().lower(), str(name).strip().upper())
    if isinstance(arguments, dict):
        expected = TOOL_FOR_ACTION.get(kind, (None, None))[1]
        value = arguments.get(expected) if expected in arguments else next(iter(arguments.values()), "")
    else:
        value = arguments
    return SQLAction(kind, "" if value is None else str(value))


# ---------------------------------------------------------------------------------------------- context budget
def fit_context(
    messages: list[dict[str, Any]],
    observation: SQLObservation,
    count_tokens: Callable[[list[dict[str, Any]]], int],
    max_tokens: int,
) -> list[dict[str, Any]]:
    """The conversation trimmed to `max_tokens` (as measured by `count_tokens`), or unchanged if it fits.

    Keeps the system prompt, the question, the schema (table names plus the columns of every described table,
    from `observation.schema_info`) and a one-line summary of the dropped actions in the first user turn, then
    as many of the most recent turns as fit. A turn is an assistant message with the tool results after it.
    """
    if count_tokens(messages) <= max_tokens:
        return messages
    system, rest = messages[0], messages[2:]  # the first user turn is rebuilt below
    turns: list[list[dict[str, Any]]] = []
    for message in rest:
        if message["role"] == "assistant" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    history = list(observation.action_history)
    for keep in range(len(turns) - 1, -1, -1):
        kept = turns[len(turns) - keep :] if keep else []
        dropped = len(history) - sum(1 for t in kept for m in t if m["role"] == "tool")
        summary = "\n".join(history[: max(0, dropped)])
        user = {
            "role": "user",
            "content": (
                f"Question: {observation.question.strip()}\n{cut(observation.schema_info.strip())}\n"
                + (f"Earlier steps:\n{cut(summary, 800)}\n" if summary else "")
                + f"You have {observation.budget_remaining} steps left."
            ),
        }
        candidate = [system, user] + [m for t in kept for m in t]
        if count_tokens(candidate) <= max_tokens or keep == 0:
            return candidate
    return messages  # unreachable: keep == 0 always returns
