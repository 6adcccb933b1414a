"""One guard for every WebSocket the server serves: who may hold one, how long it may stay silent, what its
messages may hold (ASGI middleware in front of OpenEnv's app).

OpenEnv opens a session for each WebSocket on `/ws` and on `/mcp` (JSON-RPC over a WebSocket; SQLEnv has no MCP
tools, so every call there answers "Environment does not support MCP"), and a later OpenEnv may add more. The guard
takes every WebSocket handshake that one of the app's routes would take, read from the app's router at each
handshake (so a route added later is guarded as well); a path no route takes goes on to the app, which refuses
it (403) before accepting. Issue 49: the guard once checked only the path `/ws`, and 64 silent `/mcp` sockets from
one address took all 64 sessions, past every timeout and message bound.

- Who (`SessionShares`): a client address (an IPv6 one: its /64; behind `proxy_hops` trusted proxies the entry the
  outermost appended, `sqlenv.client_address.client_key`) holds at most `per_client` WebSockets, and one that
  already holds `h` gets another only while more than `h` sessions are free, unless no other client holds one.
  So a client never takes more than half the room the others leave it, and a few addresses cannot take every
  session: four take at most 16 + 16 + 16 + 8 of 64 (issue 49: 4 x 16 took all 64), and a client that holds
  none is refused only by the server's own limit. A client alone may fill the server up to `per_client` (a
  trainer on a server of its own). Refused: accepted, told `CAPACITY_REACHED` in OpenEnv's error message (saying
  why), closed (1008).
- How long (`_Clock`): a WebSocket that has not sent OpenEnv's `reset` within `reset_s` of connecting is closed,
  and so is one that keeps the server waiting on it for `idle_s`: waiting for its next message, or for it to
  take a reply (a send that has not gone out). The time the app spends working (a 5 s step) does not count, and
  a message or a reply taken restarts the clock. Issue 49: the clock ran only while the app waited for a
  message, so a client that asked and never read kept its session past both timeouts, the app blocked in
  `send()`. Each wait the app makes is bounded by the clock's deadline, so nothing the client does or leaves
  undone stops it.
- What: a message of more than `MAX_JSON_VALUES` JSON values closes the connection before anything parses it
  (1009, as uvicorn closes one over its size limit, `ws_max_size`, unread).

The server closes with a close frame (1000 for silences, a reason saying why), within `CLOSE_SEND_S`: a client
whose unread replies fill the connection cannot take one, and gets none. The app then hears the disconnect a
client's own close would give it, and OpenEnv ends the session as it ends a dropped one: environment closed, slot
free. What the connection still holds (its unsent bytes) goes with it (`sqlenv.server.connections`).

This is the server's idle timeout: OpenEnv's reaper (`ConcurrencyConfig.session_timeout`) is off. It closed an
idle session's environment but not its WebSocket, and OpenEnv's loop went on resetting and stepping there,
outside the session limit. Ending the connection ends everything the session holds, through one path.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.routing import Match

from sqlenv.client_address import client_key
from sqlenv.server.json_values import MAX_JSON_VALUES, too_many_values

__all__ = ["WebSocketGuard", "SessionShares", "CLOSE_SEND_S"]

#: Seconds the server's close frame may take to go out; past them the client is reading nothing, and the
#: connection is ended without one.
CLOSE_SEND_S = 2.0
#: The close reasons (at most 123 bytes, as the protocol requires).
_IDLE_CLOSE_REASON = "no message for {s:g} s: the session is closed; connect again for a new one"
_UNREAD_CLOSE_REASON = "replies unread for {s:g} s: the session is closed; connect again for a new one"
_NO_RESET_CLOSE_REASON = "no reset within {s:g} s of connecting: the session is closed; connect again and reset"
_TOO_MANY_VALUES_CLOSE_REASON = f"a message of more than {MAX_JSON_VALUES} JSON values: the session is closed"
#: The longest message read to see whether it is a reset (a reset is a few hundred bytes).
_MAX_RESET_CHARS = 65_536


class SessionShares:
    """The WebSockets each client holds, and whether it may open one more (the rule: see the module docstring).
    Used on the event loop's thread only."""

    def __init__(self, max_sessions: int, per_client: int):
        self.max_sessions, self.per_client = max_sessions, per_client
        self.total = 0
        self._held: dict[str, int] = {}

    def held(self, client: str) -> int:
        return self._held.get(client, 0)

    def refusal(self, client: str) -> tuple[str, int, int] | None:
        """Why `client` may not open one more (the message, and the numbers OpenEnv's error carries: sessions
        counted, their bound), or None when it may. A client holding none is left to the server's own limit."""
        held = self.held(client)
        if held >= self.per_client:
            return (f"this client address already holds {held} sessions, the most one client may hold on this "
                    "server (--max-sessions-per-client): close one first"), held, self.per_client
        free = self.max_sessions - self.total
        if held and held >= free and self.total > held:
            return (f"this client address holds {held} sessions and {max(free, 0)} are free: a client may hold "
                    "no more than the sessions the others leave free; close one or try later"), held, max(free, 0)
        return None

    def take(self, client: str) -> None:
        self._held[client] = self.held(client) + 1
        self.total += 1

    def give(self, client: str) -> None:
        left = self._held.pop(client) - 1
        if left:
            self._held[client] = left
        self.total -= 1


class WebSocketGuard:
    """ASGI middleware: every WebSocket that one of `router`'s routes serves, bounded as the module says.

    Args:
        app: the app behind (OpenEnv's, with its other middleware).
        router: the app's router (`app.router`): its routes say which handshakes the guard takes.
        max_sessions: the server's session limit (`SessionShares`).
        idle_s: seconds a WebSocket may keep the server waiting on it.
        reset_s: seconds a new WebSocket has to send its first reset.
        per_client: most WebSockets one client holds.
        proxy_hops: trusted reverse proxies appending to `X-Forwarded-For` (`sqlenv.client_address`).
    """

    def __init__(self, app: Any, router: Any, max_sessions: int, idle_s: float, reset_s: float, per_client: int,
                 proxy_hops: int = 0):
        self.app, self.router = app, router
        self.idle_s, self.reset_s = idle_s, reset_s
        self.proxy_hops = proxy_hops
        self.shares = SessionShares(max_sessions, per_client)

    def serves(self, scope: dict) -> bool:
        """Whether one of the app's routes takes this WebSocket handshake (`/ws`, `/mcp`, any other)."""
        return any(route.matches(scope)[0] is Match.FULL for route in self.router.routes)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        # A handshake no route takes goes on to the app, which refuses it (403) before accepting: refusing it
        # here would accept it first (101) to say why, as the cap once did for `/ws/ui`.
        if scope["type"] != "websocket" or not self.serves(scope):
            await self.app(scope, receive, send)
            return
        client = client_key(scope, self.proxy_hops)
        refusal = self.shares.refusal(client)
        if refusal is not None:
            await _refuse(receive, send, *refusal)
            return
        self.shares.take(client)
        try:
            clock = _Clock(self.idle_s, self.reset_s, receive, send)
            await self.app(scope, clock.receive, clock.send)
        finally:
            self.shares.give(client)


class _Clock:
    """One WebSocket's deadlines and message bound, around the app's `receive` and `send` (see the module)."""

    def __init__(self, idle_s: float, reset_s: float, receive: Any, send: Any):
        self.loop = asyncio.get_running_loop()
        self.idle_s, self.reset_s = idle_s, reset_s
        self.reset_by = self.loop.time() + reset_s
        self.reset_seen = False
        self._receive, self._send = receive, send
        self.closed: dict | None = None  # the disconnect the app hears once the server has closed

    def _deadline(self) -> tuple[float, bool]:
        """When a wait on the client that starts now must end, and whether that is the reset deadline."""
        idle_end = self.loop.time() + self.idle_s
        if not self.reset_seen and self.reset_by <= idle_end:
            return self.reset_by, True
        return idle_end, False

    async def receive(self) -> dict:
        if self.closed is not None:
            return self.closed
        deadline, for_reset = self._deadline()
        try:
            async with asyncio.timeout_at(deadline):  # a cancelled wait leaves the message in uvicorn's queue
                message = await self._receive()
        except TimeoutError:
            return await self._close(1000, _NO_RESET_CLOSE_REASON.format(s=self.reset_s) if for_reset
                                     else _IDLE_CLOSE_REASON.format(s=self.idle_s))
        text = message.get("text") if message["type"] == "websocket.receive" else None
        if text is not None:
            if too_many_values(text):
                return await self._close(1009, _TOO_MANY_VALUES_CLOSE_REASON)
            if not self.reset_seen:
                self.reset_seen = _is_reset(text)
        return message

    async def send(self, message: dict) -> None:
        if self.closed is not None:
            return  # after the server's close (or the client's going), the app's sends have nowhere to go
        deadline, for_reset = self._deadline()
        try:
            async with asyncio.timeout_at(deadline):  # uvicorn's send waits for the client to read, then writes
                await self._send(message)
        except TimeoutError:  # the client reads nothing: no close frame either (it could not go out)
            self.closed = _disconnect(1000, _NO_RESET_CLOSE_REASON.format(s=self.reset_s) if for_reset
                                      else _UNREAD_CLOSE_REASON.format(s=self.idle_s))
        except OSError:  # the client went while the reply waited (uvicorn's ClientDisconnected)
            self.closed = _disconnect(1006, "the client went")

    async def _close(self, code: int, why: str) -> dict:
        self.closed = _disconnect(code, why)
        try:
            async with asyncio.timeout(CLOSE_SEND_S):
                await self._send({"type": "websocket.close", "code": code, "reason": why})
        except Exception:  # noqa: BLE001 - the client left meanwhile, or reads nothing: no frame to send
            pass
        return self.closed


def _disconnect(code: int, reason: str) -> dict:
    return {"type": "websocket.disconnect", "code": code, "reason": reason}


def _is_reset(text: Any) -> bool:
    """Whether a WebSocket message is OpenEnv's `reset` (read as OpenEnv reads it: `json.loads`, then `type`).
    A reset is a few hundred bytes: a longer message is not parsed here (OpenEnv reads it as usual)."""
    if not isinstance(text, str) or len(text) > _MAX_RESET_CHARS:
        return False
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(message, dict) and message.get("type") == "reset"


async def _refuse(receive: Any, send: Any, why: str, counted: int, bound: int) -> None:
    """Accept, say why in OpenEnv's error message (`CAPACITY_REACHED`, as a full server does), and close."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": {
        "message": why, "code": "CAPACITY_REACHED", "active_sessions": counted, "max_sessions": bound}})})
    await send({"type": "websocket.close", "code": 1008, "reason": "too many sessions from this client address"})
