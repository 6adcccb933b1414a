"""An HTTP request's body read by an ASGI middleware before the app sees it: bounded in bytes and in time, then
handed on as if unread.

The OpenEnv server (`sqlenv.server.app`) and the dashboard (`dashboard.access.http_guard`) both check a body before the
app behind them reads it. Each bound is at its cause: a body over `max_bytes` stops being read where it passes the
bound, and one that has not all arrived within `timeout_s` (a client sending a byte at a time holds a connection
and a coroutine for as long as it likes) stops being waited for.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

__all__ = ["BodyTooLarge", "read_body", "replaying"]

Receive = Callable[[], Awaitable[dict]]


class BodyTooLarge(Exception):
    """The body passed `max_bytes` (what was read is dropped)."""


async def read_body(receive: Receive, max_bytes: int, timeout_s: float) -> bytes | None:
    """The whole body of the request `receive` delivers; None if the client disconnected first.

    Raises:
        BodyTooLarge: past `max_bytes` (reading stops there).
        TimeoutError: not all of it arrived within `timeout_s` seconds.
    """
    body = bytearray()
    async with asyncio.timeout(timeout_s):
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > max_bytes:
                raise BodyTooLarge(len(body))
    return bytes(body)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` for the app behind: the body read by `read_body` first, then the real channel (a disconnect,
    which the server waits for after the body)."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
