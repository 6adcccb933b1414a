"""Code fences in model and user text (```` ```sql\\n...\\n``` ````), read in time linear in the text.

The answer verifier and the model-output parser both unwrap a text that is one code fence. They did it with
patterns of the shape ```` ^```[A-Za-z0-9_+-]*\\s*\\n?(.*?)\\n?```$ ````: a lazy body between an optional run that
overlaps it and an anchored closing fence, which the regular-expression engine tries at every split of the two
(issue 35: a fence followed by 16,000 newlines took 5.4 s, holding the interpreter lock; the 1,000,000 characters an
ANSWER may have, hours). `fence_body` finds the same body from positions instead: the closing fence is where the
text ends, the body starts where `opening` (a greedy run, matched once) stops.
"""

from __future__ import annotations

import re

__all__ = ["fence_body", "ANSWER_FENCE_OPENING", "ACTION_FENCE_OPENING"]

FENCE = "```"
#: What may follow the opening fence of an ANSWER before its body: a language name, then any whitespace.
ANSWER_FENCE_OPENING = re.compile(r"[A-Za-z0-9_+\-]*\s*")
#: ... of an action's argument in a model's plain-text turn: a language name, then one newline.
ACTION_FENCE_OPENING = re.compile(r"[A-Za-z]*\n?")


def fence_body(text: str, opening: re.Pattern[str]) -> str | None:
    """The body of `text` when the whole text is one code fence, else None.

    `text` must start with ```` ``` ```` and end with ```` ``` ```` (or ```` ```\\n ````), the two apart; `opening`
    is matched once right after the first fence (a pattern of greedy runs that cannot pass a backtick, such as
    `ANSWER_FENCE_OPENING`) and the body starts where it stops; one newline before the closing fence is not part of
    the body. This is what `re.match("^```" + opening.pattern + r"(.*?)\\n?```$", text, re.DOTALL).group(1)`
    returned, in one pass over the text."""
    end = len(text) - 1 if text.endswith("\n") else len(text)  # `$` also matches before a final newline
    close = end - len(FENCE)
    if close < len(FENCE) or not text.startswith(FENCE) or text[close:end] != FENCE:
        return None
    start = opening.match(text, len(FENCE), close).end()
    stop = close - 1 if close - 1 >= start and text[close - 1] == "\n" else close
    return text[start:stop]
