"""A thin OpenAI-compatible chat server around one causal LM: `/v1/chat/completions` with tool calls.

    python -m training.generation.openai_server --model builtin:tiny --port 8001        # or a run's final/ folder, a Hub id
    python -m sqlenv eval --policy openai --base-url http://127.0.0.1:8001/v1 --model builtin:tiny --concurrency 8

It renders a request exactly as training renders a conversation (`training.generation.chat.ChatRenderer`: the chat template
with the request's tool schemas, TRL's training template for Qwen3) and parses the generated turn with TRL's
`parse_response`, so a trained run answers with the tool calls it learned. It is what the tests and
`bench/decoding/openai_eval.py` evaluate against on 127.0.0.1; for real models use vLLM or `transformers serve`.

Concurrent requests are decoded together: a batcher thread takes every request waiting (up to `--max-batch`)
and runs one batched generation (`training.generation.decoding.generate_new_tokens`), as a serving engine batches, so N
episodes in flight cost far less than N times one. Requests it cannot serve get OpenAI-style errors: 400 for a
bad body or a prompt longer than the model's context, 401 for a wrong key when `--api-key-env` is set, 404 for
another model name. Only what OpenAI-compatible clients need is implemented: no streaming, `n` = 1.

What a request may cost (issue 59: one 20 MB message took 33.9 s to a 400 with `/health` blocked 33.7 s and RSS
485 -> 3,041 MB, 20,000 short messages held `/health` 7 s, and `n = "abc"` answered 500): a body over
`--max-body-bytes` (1 MiB) is answered 413 from its declared length, or where it passes the bound, before it is read
further, and one not all sent within `BODY_TIMEOUT_S` gets 408; every field is checked before any work (`check`: a
clear 400 naming the field; at most `MAX_MESSAGES` messages and `MAX_TOOLS` tools); parsing, rendering and
tokenizing run on a worker thread (`RENDER_THREADS`), never on the event loop, and at most `max_pending` requests
are rendering or waiting for a batch (429 past that).
"""


# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request) at runtime.
import argparse
import asyncio
import inspect
import json
import math
import os
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatModel", "create_app", "main", "DEFAULT_MAX_BODY_BYTES", "MAX_MESSAGES", "MAX_TOOLS"]

#: The largest request body read: a longer one is refused 413 unread (a model's context of 40,960 tokens is ~160 KB of
#: text; JSON escapes at most double it).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: Seconds a client has to send its whole body once the head is read.
BODY_TIMEOUT_S = 30.0
#: Most messages and tools in one request (an agent's episode of 15 steps is ~32 messages).
MAX_MESSAGES, MAX_TOOLS = 1024, 128
#: Threads that parse and render requests, off the event loop (a render holds the interpreter for most of its time).
RENDER_THREADS = 2
#: Longest `model` name and template variable name read.
_MAX_NAME_CHARS = 256


class RequestError(ValueError):
    """A request this server cannot serve: the HTTP status and OpenAI-style error type go with the message."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass
class _Checked:
    """A request whose every field was checked (`ChatModel.check`): what rendering and decoding need."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int
    temperature: float
    template_kwargs: dict[str, Any]
    model: str


@dataclass
class _Job:
    ids: list[int]
    max_tokens: int
    temperature: float
    future: Future = field(default_factory=Future)


class ChatModel:
    """One model and tokenizer answering chat requests, with concurrent requests decoded in one batch.

    Args:
        model: a causal LM (`transformers`), in eval mode on its device.
        tokenizer: its tokenizer (a chat template with tool support, e.g. Qwen3's or the tiny model's).
        name: the model name clients ask for (`model` in a request; default "default" accepts any name).
        max_batch: most requests decoded together (default 16).
        max_pending: most requests waiting for a batch (default 256); more are answered 429.
        tool_calling: accept requests with tools (default True). False answers them with 400, as vLLM does when
            started without `--enable-auto-tool-choice`: an endpoint whose model cannot call tools.
    """

    def __init__(self, model: Any, tokenizer: Any, name: str = "default", max_batch: int = 16,
                 max_pending: int = 256, tool_calling: bool = True):
        from training.generation.chat import ChatRenderer

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch = max_batch
        self.tool_calling = tool_calling
        self.max_pending = max_pending
        # Tools come with each request; the renderer is only used for its template, kwargs and EOS ids.
        self.renderer = ChatRenderer(tokenizer, tools=[], chat_template_kwargs={"enable_thinking": False})
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.context_tokens = int(limit or 4096)
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._renderers = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="openai-server-render")
        self._pending, self._pending_lock = 0, threading.Lock()  # requests rendering or waiting for a batch
        # apply_chat_template's own parameters: a template variable of one of these names would change the call.
        self._render_arguments = frozenset(inspect.signature(tokenizer.apply_chat_template).parameters)
        self._thread = threading.Thread(target=self._serve_batches, name="openai-server-batcher", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------------------------- requests
    def check(self, body: Any) -> _Checked:
        """Every field of a `/v1/chat/completions` body, checked before any work; RequestError (400, naming the
        field; 404 for another model) on the first that is wrong."""
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        stream = body.get("stream")
        if stream not in (None, False):
            raise RequestError("stream is not supported by this server" if stream is True
                               else f"stream must be a boolean, got {_shown(stream)}")
        n = body.get("n")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
            raise RequestError(f"n must be 1, got {_shown(n)}")
        requested = body.get("model")
        if requested is not None and (not isinstance(requested, str) or len(requested) > _MAX_NAME_CHARS):
            raise RequestError(f"model must be a name of at most {_MAX_NAME_CHARS} characters")
        requested = requested or ""
        if self.name != "default" and requested != self.name:
            raise RequestError(f"the model {requested!r} does not exist; this server serves {self.name!r}", 404,
                               "not_found_error")
        max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), 256)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.context_tokens:
            raise RequestError(f"max_tokens must be an integer from 1 to the model's context ({self.context_tokens}), "
                               f"got {_shown(max_tokens)}")
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else temperature
        if (isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature)
                or not 0 <= temperature <= 2):
            raise RequestError(f"temperature must be a number from 0 to 2, got {_shown(temperature)}")
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object")
        for key in template_kwargs:
            if not key.isidentifier() or len(key) > _MAX_NAME_CHARS or key in self._render_arguments:
                raise RequestError(f"chat_template_kwargs: {_shown(key)} is not a template variable this server takes")
        tools = _list(body, "tools", required=False, most=MAX_TOOLS)
        tools = [_tool_schema(t) for t in tools]
        if tools and not self.tool_calling:
            raise RequestError("tool calling is not enabled on this server (started with --no-tool-calling)")
        # Each message renders to at least one token: more than the context holds cannot fit.
        messages = _list(body, "messages", most=min(MAX_MESSAGES, self.context_tokens))
        if not messages:
            raise RequestError("messages is empty")
        messages = [_hf_message(m, i) for i, m in enumerate(messages)]
        return _Checked(messages, tools, max_tokens, float(temperature), template_kwargs, requested or self.name)

    def complete(self, body: Any) -> Future:
        """Check a `/v1/chat/completions` body (RequestError at once), then render and decode it off the caller's
        thread: a future of the response dict (or RequestError: a conversation the template cannot render, or
        longer than the model's context)."""
        request = self.check(body)
        with self._pending_lock:  # bounded: clients retry a 429 with backoff
            if self._pending >= self.max_pending:
                raise RequestError(f"the server has {self.max_pending} requests waiting; try again", 429,
                                   "rate_limit_error")
            self._pending += 1
        outer: Future = Future()
        outer.add_done_callback(lambda _: self._release())
        try:
            self._renderers.submit(self._render_and_queue, request, outer)
        except RuntimeError as exc:  # the pool is shut down
            outer.set_exception(exc)
        return outer

    def _release(self) -> None:
        with self._pending_lock:
            self._pending -= 1

    def _render_and_queue(self, request: _Checked, outer: Future) -> None:
        """On a render thread: the prompt's ids, the context check, then a place in the next batch."""
        try:
            try:
                ids = self._render(request.messages, request.tools, request.template_kwargs)
            except Exception as exc:  # noqa: BLE001 - a template that cannot render this conversation is the caller's
                raise RequestError(f"cannot render the messages: {type(exc).__name__}: {str(exc)[:200]}") from None
            if len(ids) + request.max_tokens > self.context_tokens:
                raise RequestError(f"This model's maximum context length is {self.context_tokens} tokens; the "
                                   f"messages take {len(ids)} and max_tokens asks for {request.max_tokens} more")
        except RequestError as exc:
            outer.set_exception(exc)
            return
        job = _Job(ids, request.max_tokens, request.temperature)

        def finish(done: Future) -> None:
            if done.exception() is not None:
                outer.set_exception(done.exception())
                return
            try:
                outer.set_result(self._response(job, done.result(), request.tools, request.model))
            except Exception as exc:  # noqa: BLE001 - the caller hears of it, whatever it is
                outer.set_exception(exc)

        job.future.add_done_callback(finish)
        self._queue.put(job)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                template_kwargs: dict[str, Any]) -> list[int]:
        r = self.renderer
        # The request's template variables over training's defaults (thinking off), as vLLM merges them.
        variables = {**r.chat_template_kwargs, **template_kwargs}
        ids = self.tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=r.chat_template,
                                                 add_generation_prompt=True, tokenize=True, return_dict=False,
                                                 **variables)
        return list(ids)

    def _response(self, job: _Job, new: list[int], tools: list[dict[str, Any]], model: str) -> dict[str, Any]:
        eos = set(self.renderer.eos_token_ids)
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        finish = "stop" if stop is not None else "length"
        turn = new[: stop + 1] if stop is not None else new
        from trl.chat_template_utils import parse_response

        try:
            parsed = parse_response(self.tokenizer, turn, prefix=job.ids, tools=tools or None) if turn else {}
        except Exception:  # noqa: BLE001 - an unparseable turn is plain text, as TRL's fallback makes it
            parsed = {"content": self.tokenizer.decode(turn, skip_special_tokens=True)}
        message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or None}
        calls = []
        for call in parsed.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            arguments = function.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)  # OpenAI's wire format: the arguments as JSON text
            calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                          "function": {"name": str(function.get("name", "")), "arguments": arguments}})
        if calls:
            message["tool_calls"] = calls
            finish = "tool_calls"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(job.ids), "completion_tokens": len(new),
                      "total_tokens": len(job.ids) + len(new)},
        }

    # ------------------------------------------------------------------------------------------ batching
    def _serve_batches(self) -> None:
        from training.generation.decoding import generate_new_tokens

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        waiting: list[_Job] = []
        while True:
            if not waiting:
                waiting.append(self._queue.get())
            while True:  # everything queued now joins this batch
                try:
                    waiting.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            # One generation has one temperature; the longest max_tokens of the batch bounds it.
            key = waiting[0].temperature
            batch = [job for job in waiting if job.temperature == key][: self.max_batch]
            taken = {id(job) for job in batch}
            waiting = [job for job in waiting if id(job) not in taken]
            try:
                new = generate_new_tokens(self.model, [job.ids for job in batch], pad,
                                          max(job.max_tokens for job in batch), sample=key > 0,
                                          temperature=key or 1.0, eos_ids=set(self.renderer.eos_token_ids))
            except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error
                for job in batch:
                    job.future.set_exception(exc)
                continue
            for job, tokens in zip(batch, new):
                job.future.set_result(tokens[: job.max_tokens])


def _shown(value: Any) -> str:
    """A client's value in an error message, cut short (a reply never carries a long value back)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _list(body: dict[str, Any], key: str, required: bool = True, most: int | None = None) -> list[Any]:
    value = body.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{key} must be a list")
    if most is not None and len(value) > most:
        raise RequestError(f"{key} holds {len(value)} items; this server takes at most {most}")
    return value


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, or OpenAI's list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise RequestError(f"{where}: each content part must be an object with a type")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise RequestError(f"{where}: a text part's text must be a string")
                parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where}: content must be a string or a list of parts")


def _hf_message(message: Any, index: int = 0) -> dict[str, Any]:
    """An OpenAI chat message as the chat template takes it (tool-call arguments as objects, not JSON text)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise RequestError(f"{where}: each message needs a role: system, user, assistant or tool")
    role = "system" if message["role"] == "developer" else message["role"]
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), where)}
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list) or len(calls) > MAX_TOOLS:
            raise RequestError(f"{where}: tool_calls must be a list of at most {MAX_TOOLS} calls")
        out["tool_calls"] = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name", ""), str):
                raise RequestError(f"{where}: each tool call must be {{\"function\": {{\"name\": ..., \"arguments\": ...}}}}")
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except (ValueError, RecursionError):
                    pass  # rendered as the text it is
            out["tool_calls"].append({"type": "function", "function": {"name": function.get("name", ""),
                                                                       "arguments": arguments}})
    if role == "tool" and message.get("name"):
        if not isinstance(message["name"], str) or len(message["name"]) > _MAX_NAME_CHARS:
            raise RequestError(f"{where}: name must be a string of at most {_MAX_NAME_CHARS} characters")
        out["name"] = message["name"]
    return out


def _tool_schema(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise RequestError('each tool must be {"type": "function", "function": {...}}')
    if not isinstance(tool["function"].get("name"), str):
        raise RequestError("each tool's function needs a name")
    return tool


# ------------------------------------------------------------------------------------------------- app
def create_app(chat: ChatModel, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """The FastAPI app: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`.

    Args:
        chat: the model that answers.
        api_key: when set, requests must carry `Authorization: Bearer <api_key>` (401 otherwise).
        max_body_bytes: the largest request body read (413 past it, unread; default 1 MiB).
    """
    import hmac

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from sqlenv.asgi_body import BodyTooLarge, read_body

    app = FastAPI(title="SQLEnv OpenAI-compatible model server")

    def error(message: str, status: int, kind: str, close: bool = False) -> JSONResponse:
        # `connection: close` when the body was left unread: what is left of it must not be read as a request.
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                            headers={"connection": "close"} if close else None)

    def authorized(request: Request) -> bool:
        if not api_key:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode())

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/v1/models")
    async def models(request: Request):
        if not authorized(request):
            return error("invalid API key", 401, "authentication_error")
        return {"object": "list", "data": [{"id": chat.name, "object": "model", "owned_by": "sqlenv"}]}

    @app.post("/v1/chat/completions")
    async def completions(request: Request):
        if not authorized(request):
            return error("invalid API key", 401, "authentication_error", close=True)
        too_large = f"the request body is over {max_body_bytes} bytes, the most this server reads"
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            return error(too_large, 413, "invalid_request_error", close=True)
        try:
            raw = await read_body(request.receive, max_body_bytes, BODY_TIMEOUT_S)
        except BodyTooLarge:
            return error(too_large, 413, "invalid_request_error", close=True)
        except TimeoutError:
            return error(f"the request body did not arrive within {BODY_TIMEOUT_S:g} s", 408,
                         "invalid_request_error", close=True)
        if raw is None:  # the client went
            return error("the client disconnected", 400, "invalid_request_error", close=True)
        try:
            body = await asyncio.to_thread(json.loads, raw)
        except (ValueError, RecursionError):
            return error("the body is not JSON", 400, "invalid_request_error")
        try:
            return await asyncio.wrap_future(chat.complete(body))
        except RequestError as exc:
            return error(str(exc), exc.status, exc.kind)
        except Exception as exc:  # noqa: BLE001 - a generation that failed is the server's error, said in one line
            return error(f"generation failed: {type(exc).__name__}: {exc}", 500, "server_error")

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.generation.openai_server",
                                     description="Serve a model behind an OpenAI-compatible /v1/chat/completions.")
    parser.add_argument("--model", default="builtin:tiny",
                        help="builtin:tiny (default), a saved model folder (a run's final/) or a Hub id")
    parser.add_argument("--served-name", default=None,
                        help="the name clients must ask for (default: the --model text; 'default' accepts any)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="TCP port (default 8001)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--max-batch", type=int, default=16, help="most requests decoded together (default 16)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-tool-calling", action="store_true",
                        help="refuse requests with tools (400), like an endpoint whose model cannot call tools")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"the largest request body read; a bigger one is answered 413 unread "
                             f"(default {DEFAULT_MAX_BODY_BYTES})")
    parser.add_argument("--api-key-env", default=None,
                        help="environment variable holding the key requests must carry (default: no key needed)")
    args = parser.parse_args(argv)
    if args.max_batch < 1:
        parser.error("--max-batch must be >= 1")
    if args.max_body_bytes < 1024:
        parser.error("--max-body-bytes must be >= 1024")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            parser.error(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    import torch
    import uvicorn

    from training.models import ModelLoadError, load_model_and_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_model_and_tokenizer(args.model, device=args.device)
    except ModelLoadError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    chat = ChatModel(model, tokenizer, name=args.served_name or args.model, max_batch=args.max_batch,
                     tool_calling=not args.no_tool_calling)
    from sqlenv.http_connections import http_protocol

    # access_log off: request lines are not needed, and nothing about a request (headers included) is logged.
    # Request heads have a deadline and a size bound (the OpenEnv server's protocol).
    uvicorn.run(create_app(chat, api_key=api_key, max_body_bytes=args.max_body_bytes), host=args.host, port=args.port,
                log_level="warning", access_log=False, http=http_protocol(BODY_TIMEOUT_S))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
