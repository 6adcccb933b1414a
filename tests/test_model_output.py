"""Parsing a model's turn (`sqlenv.agent.model_output`) on hostile text: linear time, and the same actions as before.

Issue 35: the tool-call and fence patterns backtracked quadratically on text every model completion reaches
(16,000 spaces in a tool call took 4.5 s, 16,000 letters after a fence 3.3 s, holding the interpreter lock). They are
read by positions now; the old patterns stay here as the reference the new reading must agree with."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from sqlenv.agent.model_output import parse_model_output
from sqlenv.agent.prompts import tool_call_to_action
from sqlenv.types import ACTION_TYPES, SQLAction

# parse_model_output as it was, with the patterns it used.
_OLD_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_OLD_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_OLD_ACTION_TEXT = re.compile(r"^\s*(?:\*\*)?(" + "|".join(ACTION_TYPES) + r")(?:\*\*)?\s*[:\s]\s*(.*)$",
                              re.DOTALL | re.I)
_OLD_FENCE = re.compile(r"^```[A-Za-z]*\n?(.*?)\n?```$", re.DOTALL)


def _old_parse(text: str) -> SQLAction:
    body = _OLD_THINK.sub("", text).replace("<|im_end|>", "").strip()
    match = _OLD_TOOL_CALL.search(body)
    if match:
        try:
            call = json.loads(match.group(1))
            if isinstance(call, dict) and "name" in call:
                return tool_call_to_action(call["name"], call.get("arguments", {}))
        except (json.JSONDecodeError, TypeError):
            pass
    plain = _OLD_ACTION_TEXT.match(body)
    if plain:
        argument = plain.group(2).strip()
        fenced = _OLD_FENCE.match(argument)
        if fenced:
            argument = fenced.group(1).strip()
        return SQLAction(plain.group(1).upper(), argument)
    fenced = _OLD_FENCE.match(body)
    return SQLAction("QUERY", fenced.group(1).strip() if fenced else body)


_PIECES = st.sampled_from([
    "<tool_call>", "</tool_call>", "<tool_call", "<think>", "</think>", "<|im_end|>", "```", "```sql\n", "\n", " ",
    "\t", "\u00a0", "a", "QUERY", "answer", "**ANSWER**", ":", "SELECT 1", '{"name": "query", "arguments": '
    '{"sql": "SELECT 1"}}', '{"name": "answer", "arguments": {"answer": "3"}}', '{"name": 5}', "{", "}", "é"])
TURNS = st.one_of(
    st.lists(_PIECES, max_size=12).map("".join),
    st.builds(lambda before, call, space, close: before + "<tool_call>" + space + call + space + close,
              st.sampled_from(["", "<think>x</think>", "Let me look.\n"]),
              st.sampled_from(['{"name": "query", "arguments": {"sql": "SELECT count(*) FROM t"}}',
                               '{"name": "describe", "arguments": {"table_name": "t"}}', '{"name": "answer"']),
              st.sampled_from(["", " ", "\n", " \n\t"]),
              st.sampled_from(["</tool_call>", "", "</tool_call><|im_end|>"])),
)


@given(text=TURNS)
@settings(max_examples=500, deadline=None, derandomize=True)
def test_turns_parse_as_they_did(text):
    assert parse_model_output(text) == _old_parse(text), text


_HOSTILE_TURNS = r"""
import json, time
from sqlenv.agent.model_output import parse_model_output
N = 1_000_000
shapes = {"tool call, 16,000 spaces": "<tool_call>x" + " " * 16_000 + "x",
          "tool call, a million spaces": "<tool_call>x" + " " * N + "x",
          "tool call, a million newlines": "<tool_call>x" + "\n" * N + "x",
          "fence, 16,000 letters": "```" + "a" * 16_000, "fence, a million letters": "```" + "a" * N,
          "action, fence, a million letters": "QUERY: ```" + "a" * N, "unclosed thoughts": "<think>" * (N // 7),
          "action, a million spaces": "QUERY" + " " * N + "x"}
seconds = {}
for name, text in shapes.items():
    start = time.process_time()
    parse_model_output(text)
    seconds[name] = time.process_time() - start
print(json.dumps(seconds))
"""


def test_hostile_turns_are_parsed_in_linear_time():
    """A million characters of any of the issue's shapes parse in well under a second of CPU. Run in a child process
    with a time limit: the quadratic patterns took hours at this size."""
    proc = subprocess.run([sys.executable, "-c", _HOSTILE_TURNS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds = json.loads(proc.stdout)
    assert max(seconds.values()) < 1.0, seconds
