"""The action in a model turn: a Qwen3 tool call, or `ACTION: argument` text, parsed into a `SQLAction`.

Used by every path that plays a model (the batched rollout, evals, traces, `sqlenv.evaluation.openai_policy`); plain
text and the standard library. TRL's own tool loop parses tool calls itself (`trl.chat_template_utils.parse_response`),
and `message_actions` reads the message it returns. """

from __future__ import annotations

import json
import re
from typing import Any

from sqlenv.agent.fences import ACTION_FENCE_OPENING, fence_body
from sqlenv.types import ACTION_TYPES, SQLAction
from sqlenv.agent.prompts import TOOL_FOR_ACTION, tool_call_to_action

__all__ = ["parse_model_output", "message_actions"]

# Every pattern here runs on whatever a model (or an endpoint) wrote, so each is linear in the text: a lazy body next
# to an overlapping run is found by positions instead (`_tool_call_body`, `sqlenv.agent.fences`; issue 35: 16,000 spaces
# in a tool call took 4.5 s, 16,000 letters after a fence 3.3 s).
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_ACTION_TEXT = re.compile(r"^\s*(?:\*\*)?(" + "|".join(ACTION_TYPES) + r")(?:\*\*)?\s*[:\s]\s*(.*)$", re.DOTALL | re.I)
_SPACE = re.compile(r"\s*")
_TOOL_CALL_OPEN, _TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def _tool_call_body(text: str) -> str | None:
    r"""The text of the first tool call in `text`, without the whitespace around it: from its `<tool_call>` to its
    `</tool_call>`, or to the end of the text when it is not closed; None without a `<tool_call>`. What
    `re.search(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.DOTALL).group(1)` returned, in one pass."""
    opened = text.find(_TOOL_CALL_OPEN)
    if opened < 0:
        return None
    start = _SPACE.match(text, opened + len(_TOOL_CALL_OPEN)).end()
    closed = text.find(_TOOL_CALL_CLOSE, start)
    return text[start:closed if closed >= 0 else len(text)].rstrip()


def parse_model_output(text: str) -> SQLAction:
    """The action in a model turn.

    Understands a Qwen3 tool call (`<tool_call>{"name": "query", "arguments": {"sql": ...}}</tool_call>`) and
    plain `ACTION_TYPE: argument` text (`QUERY: SELECT ...`, `answer 42`). Anything else becomes a QUERY
    with the raw text, so the environment answers with an SQL error observation instead of the run crashing.
    """
    text = "" if text is None else str(text)
    body = _THINK.sub("", text).replace("<|im_end|>", "").strip()
    call_text = _tool_call_body(body)
    if call_text is not None:
        try:
            call = json.loads(call_text)
            if isinstance(call, dict) and "name" in call:
                return tool_call_to_action(call["name"], call.get("arguments", {}))
        except (json.JSONDecodeError, TypeError):
            pass
    plain = _ACTION_TEXT.match(body)
    if plain:
        argument = plain.group(2).strip()
        fenced = fence_body(argument, ACTION_FENCE_OPENING)
        if fenced is not None:
            argument = fenced.strip()
        return SQLAction(plain.group(1).upper(), argument)
    fenced = fence_body(body, ACTION_FENCE_OPENING)
    return SQLAction("QUERY", fenced.strip() if fenced is not None else body)


def message_actions(message: dict[str, Any]) -> list[tuple[str, SQLAction]]:
    """(tool name, action) for each tool call of a parsed assistant message; the text fallback otherwise."""
    calls = message.get("tool_calls") or []
    actions = []
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        name = str(function.get("name", ""))
        actions.append((name, tool_call_to_action(name, function.get("arguments", {}))))
    if actions:
        return actions
    action = parse_model_output(message.get("content", ""))
    return [(TOOL_FOR_ACTION.get(action.action_type, (action.action_type.lower(), ""))[0], action)]

