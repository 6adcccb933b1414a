"""What one HTTP request may make the app hold: an ASGI middleware in front of every Gradio route.

Gradio reads a request's whole body before anything of the app sees it, stores every input value of an event in
the caller's session before the event's handler runs, and opens a session for any new session hash a request
names (~230 KB each for this page, before any input). Sessions live until `state_session_capacity` newer ones
push them out (`dashboard.server.SESSIONS_KEPT`). A 38 MiB table sent to a public event with a new session hash
each time once kept +38 MB a call, for good. So `RequestGuard` answers, before Gradio reads anything:

- `POST .../upload`: 403 (the app takes no files; Gradio's upload route takes them from anyone and serves them
  back at `/gradio_api/file=`);
- a request body over `MAX_BODY_BYTES`, on any route: 413, unread when its `Content-Length` says so, else cut
  where the bytes received pass the bound (a chunked body);
- a request body not all received within `SQLENV_APP_BODY_TIMEOUT_S` (10 s), on any route: 408 (a client sending
  a byte at a time held a connection and a coroutine as long as it liked; the same deadline bounds each request
  head, below any middleware: `dashboard.server.launch`);
- an event call (`/gradio_api/queue/join`, `/run/...`, `/api/...`, `/call/...`, `/component_server`): 413 when
  a session hash is longer than `MAX_SESSION_HASH_CHARS`, its `event_data` larger than `MAX_EVENT_DATA_BYTES`,
  or one input value larger than its component needs (`dashboard.access.inputs.input_limit`), naming the input.

So a session keeps at most the sum of its inputs' limits (`session_bytes_bound`), and the app at most
`SESSIONS_KEPT` of them. Refusals close the connection: what is left of a refused body is not read as the next
request.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from sqlenv.asgi_body import BodyTooLarge, read_body, replaying

from dashboard.access.inputs import (MAX_EVENT_DATA_BYTES, MAX_SESSION_HASH_CHARS, MAX_SMALL_INPUT_BYTES, input_limit,
                              oversized_input, python_size)

#: The largest request body on any route (an event's inputs are bounded one by one besides): the Runs table
#: with its row selection is the largest a page sends.
MAX_BODY_BYTES = 1024 * 1024
BODY_TIMEOUT_ENV = "SQLENV_APP_BODY_TIMEOUT_S"
#: Seconds a request's head, and then its whole body, may take to arrive (as the OpenEnv server's
#: `--request-timeout`).
DEFAULT_BODY_TIMEOUT_S = 10.0
# Gradio's routes that run an event (or a component's server function) on the caller's session.
_EVENT_ROUTE = re.compile(r"/gradio_api/(?:queue/join|(?P<kind>run|api|call/v2|call)/(?P<api>[^/]+)"
                          r"|component_server)/?$")


def _label(component: Any, index: int) -> str:
    name = getattr(component, "label", None) or getattr(component, "elem_id", None) or type(component).__name__
    return f"Input {index + 1} ({str(name)[:40]})"


def body_timeout_s(env: dict[str, str] | None = None) -> float:
    """`SQLENV_APP_BODY_TIMEOUT_S` (default 10): seconds a request's head, and then its body, may take to arrive."""
    text = ((os.environ if env is None else env).get(BODY_TIMEOUT_ENV) or str(DEFAULT_BODY_TIMEOUT_S)).strip()
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:
        raise ValueError(f"{BODY_TIMEOUT_ENV} must be a number of seconds in (0, 3600], got {text!r}")
    return value


def session_bytes_bound(blocks: Any) -> int:
    """The most one session can keep of its events' inputs: each input component's limit, once (Gradio keeps
    the latest value of each)."""
    components = {id(c): c for fn in blocks.fns.values() for c in fn.inputs if not getattr(c, "stateful", False)}
    return sum(input_limit(c) for c in components.values())


class RequestGuard:
    """ASGI middleware bounding what a request may make the app read and keep (see the module docstring).

    Args:
        app: the ASGI app behind it (Gradio's).
        blocks: the app's `gr.Blocks`, whose events' inputs give each value its limit (None: every value is held
            to `MAX_SMALL_INPUT_BYTES`).
        max_body: the largest request body in bytes (default `MAX_BODY_BYTES`).
        body_timeout_s: seconds the whole body may take to arrive (default: `body_timeout_s()`, from
            `SQLENV_APP_BODY_TIMEOUT_S`, else 10).
    """

    def __init__(self, app: Any, blocks: Any = None, max_body: int = MAX_BODY_BYTES,
                 body_timeout_s: float | None = None):
        self.app = app
        self.blocks = blocks
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s if body_timeout_s is not None else globals()["body_timeout_s"]()
        self._inputs: dict[int, tuple[list[str], list[int]]] = {}  # fn id -> its inputs' labels and limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if scope.get("method") == "POST" and path.rstrip("/").endswith("/upload"):
            await _reply(send, 403, "This app takes no files.")
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body:
            await _reply(send, 413, f"Request body over {self.max_body:,} bytes.")
            return
        event = _EVENT_ROUTE.search(path) if scope.get("method") == "POST" else None
        if event is None:
            await self._pass_bounded(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body, self.body_timeout_s)
        except BodyTooLarge:
            await _reply(send, 413, f"Request body over {self.max_body:,} bytes.")
            return
        except TimeoutError:
            await _reply(send, 408, f"Request body not received within {self.body_timeout_s:g} s.")
            return
        if body is None:
            return
        refusal = self.refusal(event["kind"], event["api"], body)
        if refusal:
            await _reply(send, 413, refusal)
            return
        await self.app(scope, replaying(body, receive), send)

    async def _pass_bounded(self, scope: dict, receive: Any, send: Any) -> None:
        """Any other route: its body is counted as the app reads it; past `max_body` the client gets 413, and past
        the body's deadline 408, and the app a disconnect."""
        received, refused, started, complete = 0, False, False, False
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s

        async def counted_receive() -> dict:
            nonlocal received, refused, complete
            if refused:
                return {"type": "http.disconnect"}
            if complete:  # after the body: the disconnect, whenever it comes
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refused = True
                if not started:
                    await _reply(send, 408, f"Request body not received within {self.body_timeout_s:g} s.")
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_body:
                    refused = True
                    if not started:
                        await _reply(send, 413, f"Request body over {self.max_body:,} bytes.")
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: dict) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out; whatever the app answers after its disconnect has nowhere to go
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted_receive, tracked_send)

    # ------------------------------------------------------------------------------------------ the check
    def refusal(self, kind: str | None, api: str | None, body: bytes) -> str | None:
        """Why an event call's body is refused, or None (then Gradio reads it as usual; a body that does not
        parse is left to Gradio, which refuses it the same way)."""
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(request, dict):
            return None
        session = request.get("session_hash")
        if session is not None and (not isinstance(session, str) or len(session) > MAX_SESSION_HASH_CHARS):
            return f"A session hash is a string of at most {MAX_SESSION_HASH_CHARS} characters."
        if python_size(request.get("event_data"), MAX_EVENT_DATA_BYTES) > MAX_EVENT_DATA_BYTES:
            return f"The event's data is too large: more than {MAX_EVENT_DATA_BYTES:,} bytes."
        labels, limits = self._event_inputs(request.get("fn_index"), api)
        if kind == "call/v2":  # the values by parameter name: each within the largest of the event's limits
            values = list(request.values())
            return oversized_input([], [max(limits, default=MAX_SMALL_INPUT_BYTES)] * len(values), values)
        data = request.get("data")
        return oversized_input(labels, limits, data if isinstance(data, list) else [data])

    def _event_inputs(self, fn_index: Any, api: str | None) -> tuple[list[str], list[int]]:
        """The labels and limits of the inputs of the event a request names (by `fn_index`, as the page and
        Gradio's client send it, else by the API name in the route); ([], []) for none."""
        fns = getattr(self.blocks, "fns", None) or {}
        fn = None
        if isinstance(fn_index, int) and not isinstance(fn_index, bool):
            fn = fns.get(fn_index)
        elif api:
            fn = next((f for f in fns.values() if getattr(f, "api_name", None) == api), None)
        if fn is None:
            return [], []
        key = id(fn)
        if key not in self._inputs:
            self._inputs[key] = ([_label(c, i) for i, c in enumerate(fn.inputs)],
                                 [input_limit(c) for c in fn.inputs])
        return self._inputs[key]


async def _reply(send: Any, status: int, text: str) -> None:
    data = json.dumps({"detail": text}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": data})
