"""The action in a model turn: a Qwen3 tool call, or `ACTION: argument` text, parsed into a `SQLAction`.

Used by every path that plays a model (the batched rollout, evals, traces, `sqlenv.openai_policy`); plain text and
the standard library. TRL's own tool loop parses tool calls itself (`trl.chat_template_utils.parse_response`), and `message_actions` reads the message it returns.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqlenv.types import ACTION_TYPES, SQLAction
from sqlenv.prompts import TOOL_FOR_ACTION, tool_call_to_action

__all__ = ["parse_model_output", "message_actions"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_ACTION_TEXT = re.compile(r"^\s*(?:\*\*)?(" + "|".join(ACTION_TYPES) + r")(?:\*\*)?\s*[:\s]\s*(.*)$", re.DOTALL | re.I)
_FENCE = re.compile(r"^```[A-Za-z]*\n?(.*?)\n?```$", re.DOTALL)


def parse_model_output(text: str) -> SQLAction:
    """The action in a model turn.

    Understands a Qwen3 tool call (`<tool_call>{"name": "query", "arguments": {"sql": ...}}</tool_call>`) and
    plain `ACTION_TYPE: argument` text (`QUERY: SELECT ...`, `answer 42`). Anything else becomes a QUERY
    with the raw text, so the environment answers with an SQL error observation instead of the run crashing.
    """
    text = "" if text is None else str(text)
    body = _THINK.sub("", text).replace("<|im_end|>", "").strip()
    match = _TOOL_CALL.search(body)
    if match:
        try:
            call = json.loads(match.group(1))
            if isinstance(call, dict) and "name" in call:
                return tool_call_to_action(call["name"], call.get("arguments", {}))
        except (json.JSONDecodeError, TypeError):
            pass
    plain = _ACTION_TEXT.match(body)
    if plain:
        argument = plain.group(2).strip()
        fenced = _FENCE.match(argument)
        if fenced:
            argument = fenced.group(1).strip()
        return SQLAction(plain.group(1).upper(), argument)
    fenced = _FENCE.match(body)
    return SQLAction("QUERY", fenced.group(1).strip() if fenced else body)


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

