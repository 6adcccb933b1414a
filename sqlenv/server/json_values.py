"""How many values a client's JSON message would make the server build, counted before anything parses it.

OpenEnv parses every WebSocket message (`json.loads`) and FastAPI every HTTP body on the server's event loop, where
every session's messages and `/health` wait their turn. Parsing costs by the values built, not by the bytes: a
16 MiB message of `{}`s (5.6 million objects) held the loop 2 s and the process 0.8 GB, and even 1 MiB of them
(350,000 objects) holds it ~0.07 s, while a 1 MiB string parses in ~1 ms. A real message has a few dozen values
(`{"type": "step", "data": {"action_type": "QUERY", "argument": "..."}}`), so a message that would build more than
`MAX_JSON_VALUES` is refused unparsed.

`too_many_values` counts the separators and openers (`,` `:` `[` `{`) outside the message's strings: a JSON text
with `n` of them has at most `n + 1` values. It is linear in the text and runs in C (`str.count`, `replace`,
`split`): ~2 ms for 1 MiB of any shape. Text that is not JSON is counted the same way (its parse fails early, or
past the bound it is refused like the rest).
"""

from __future__ import annotations

import json

__all__ = ["MAX_JSON_VALUES", "too_many_values"]

#: The most separators and openers outside strings (so at most one value more) a message may have. A step has ~10,
#: a reset ~20; parsing 4,096 values takes well under a millisecond.
MAX_JSON_VALUES = 4096


def too_many_values(text: str | bytes, limit: int = MAX_JSON_VALUES) -> bool:
    """Whether parsing `text` (a JSON text, or bytes in one of the encodings `json.loads` reads) would build more
    than `limit` + 1 values: more than `limit` of `,` `:` `[` `{` outside its strings.

    Bytes that do not decode are left to the parser (which refuses them at once)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
        except (UnicodeDecodeError, LookupError):
            return False
    if "\\" in text:
        # Inside strings a backslash only ever starts an escape: drop escaped backslashes, then escaped quotes,
        # and every quote left opens or closes a string.
        text = text.replace("\\\\", "").replace('\\"', "")
    # A string is two quotes, and values are separated: more than 2 * limit + 2 quotes is past the bound (or not
    # JSON). Checked first, so that the split below makes at most that many parts.
    quotes = text.count('"')
    if quotes > 2 * limit + 2:
        return True
    if quotes:
        text = "".join(text.split('"')[::2])  # the even parts are outside the strings
    count = 0
    for mark in ",:[{":
        count += text.count(mark)
        if count > limit:
            return True
    return False
