"""`sqlenv.server.json_values`: the values a JSON message would build, counted before it is parsed (issue 43).

The count is checked against the parsed value itself (`_marks`: one opener per container, a colon per key, a comma
between items), over generated JSON (Hypothesis) with the strings that could fool a count over the text: quotes,
backslashes, escaped quotes after escaped backslashes, the marks themselves, non-ASCII, in both of `json.dumps`'s
spellings, and as the bytes `json.loads` reads (UTF-8, UTF-16, UTF-32).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("openenv.core", reason="the server extra is not installed (pip install 'sqlenv[server]')")

from sqlenv.server.json_values import MAX_JSON_VALUES, too_many_values  # noqa: E402

TRICKY_TEXT = st.text(alphabet=st.sampled_from(['"', "\\", ",", ":", "[", "{", "]", "}", "a", " ", "é", "\n", "💡"]),
                      max_size=12)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY_TEXT,
                    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TRICKY_TEXT, inner, max_size=6),
                    max_leaves=40)


def _marks(value) -> int:
    """`,` `:` `[` `{` of `value` written as JSON, counted from the value, not from any text."""
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(_marks(v) for v in value)
    if isinstance(value, dict):
        return 1 + len(value) + max(len(value) - 1, 0) + sum(_marks(v) for v in value.values())
    return 0


@given(value=JSON, ascii_only=st.booleans(), encoding=st.sampled_from([None, "utf-8", "utf-16", "utf-32"]))
def test_the_count_is_the_parsed_values(value, ascii_only, encoding):
    text = json.dumps(value, ensure_ascii=ascii_only)
    data = text if encoding is None else text.encode(encoding)
    marks = _marks(value)
    assert too_many_values(data, limit=marks) is False
    if marks:
        assert too_many_values(data, limit=marks - 1) is True


def test_a_real_message_is_far_under_the_bound_whatever_its_strings():
    argument = ('SELECT "a", \'b\\"c\', [d] FROM t WHERE x IN (1, 2, 3) -- {"k": [1, 2]}\n' * 300)[:20_000]
    for message in ({"type": "step", "data": {"action_type": "QUERY", "argument": argument}},
                    {"type": "step", "data": {"action_type": "ANSWER", "argument": '[["a", 1], ["b", 2]]' * 50_000}},
                    {"type": "reset", "data": {"seed": 7, "question_id": "q-1", "step_budget": 10,
                                               "episode_id": "e"}}):
        assert not too_many_values(json.dumps(message))
        assert not too_many_values(json.dumps(message, ensure_ascii=False).encode())


def test_a_mebibyte_of_small_values_is_refused():
    mib = 1024 * 1024
    shapes = {"objects": "[" + ",".join(["{}"] * (mib // 3)) + "]",
              "numbers": "[" + ",".join(["1"] * (mib // 2)) + "]",
              "strings": "[" + ",".join(['""'] * (mib // 3)) + "]",
              "keys": "{" + ",".join(f'"{i}":0' for i in range(mib // 10)) + "}",
              "depth": "[" * mib,
              "quotes": '"' * mib}
    for name, text in shapes.items():
        assert too_many_values(text), name
        assert too_many_values(text.encode("utf-16")), name


def test_bytes_that_do_not_decode_are_left_to_the_parser():
    assert too_many_values(b"[" * 10_000 + b"\xff") is False  # not UTF-8: json.loads refuses it unread
    assert too_many_values(b"[" * (MAX_JSON_VALUES + 1)) is True
