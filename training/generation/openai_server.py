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
"""


# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request) at runtime.
import argparse
import asyncio
import json
import os
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatModel", "create_app", "main"]


class RequestError(ValueError):
    """A request this server cannot serve: the HTTP status and OpenAI-style error type go with the message."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.kind = kind


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
        self._thread = threading.Thread(target=self._serve_batches, name="openai-server-batcher", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------------------------- requests
    def complete(self, body: dict[str, Any]) -> Future:
        """Check and render a `/v1/chat/completions` body; a future of the response dict (or RequestError)."""
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        if body.get("stream"):
            raise RequestError("stream is not supported by this server")
        if int(body.get("n", 1) or 1) != 1:
            raise RequestError("n must be 1")
        requested = str(body.get("model", ""))
        if self.name != "default" and requested != self.name:
            raise RequestError(f"the model {requested!r} does not exist; this server serves {self.name!r}", 404,
                               "not_found_error")
        messages = [_hf_message(m) for m in _list(body, "messages")]
        if not messages:
            raise RequestError("messages is empty")
        tools = [_tool_schema(t) for t in _list(body, "tools", required=False)]
        if tools and not self.tool_calling:
            raise RequestError("tool calling is not enabled on this server (started with --no-tool-calling)")
        max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), 256)
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else temperature
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise RequestError(f"temperature must be a number from 0 to 2, got {temperature!r}")
        template_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(template_kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object")
        try:
            ids = self._render(messages, tools, template_kwargs)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render this conversation is the caller's
            raise RequestError(f"cannot render the messages: {type(exc).__name__}: {exc}") from None
        if len(ids) + max_tokens > self.context_tokens:
            raise RequestError(f"This model's maximum context length is {self.context_tokens} tokens; the messages "
                               f"take {len(ids)} and max_tokens asks for {max_tokens} more")
        if self._queue.qsize() >= self.max_pending:  # bounded: clients retry a 429 with backoff
            raise RequestError(f"the server has {self.max_pending} requests waiting; try again", 429,
                               "rate_limit_error")
        job = _Job(ids, int(max_tokens), float(temperature))
        self._queue.put(job)
        outer: Future = Future()

        def finish(done: Future) -> None:
            if done.exception() is not None:
                outer.set_exception(done.exception())
            else:
                outer.set_result(self._response(job, done.result(), tools, requested or self.name))

        job.future.add_done_callback(finish)
        return outer

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


def _list(body: dict[str, Any], key: str, required: bool = True) -> list[Any]:
    value = body.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise RequestError(f"{key} must be a list")
    return value


def _text(content: Any) -> str:
    """Message content as text: a string, or OpenAI's list of parts (text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise RequestError("message content must be a string or a list of parts")


def _hf_message(message: Any) -> dict[str, Any]:
    """An OpenAI chat message as the chat template takes it (tool-call arguments as objects, not JSON text)."""
    if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise RequestError("each message needs a role: system, user, assistant or tool")
    role = "system" if message["role"] == "developer" else message["role"]
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    if role == "assistant" and message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            function = (call or {}).get("function") or {}
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass  # rendered as the text it is
            calls.append({"type": "function", "function": {"name": str(function.get("name", "")),
                                                           "arguments": arguments}})
        out["tool_calls"] = calls
    if role == "tool" and message.get("name"):
        out["name"] = str(message["name"])
    return out


def _tool_schema(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise RequestError('each tool must be {"type": "function", "function": {...}}')
    return tool


# ------------------------------------------------------------------------------------------------- app
def create_app(chat: ChatModel, api_key: str | None = None):
    """The FastAPI app: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`.

    Args:
        chat: the model that answers.
        api_key: when set, requests must carry `Authorization: Bearer <api_key>` (401 otherwise).
    """
    import hmac

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="SQLEnv OpenAI-compatible model server")

    def error(message: str, status: int, kind: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

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
            return error("invalid API key", 401, "authentication_error")
        try:
            body = await request.json()
        except ValueError:
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
    parser.add_argument("--api-key-env", default=None,
                        help="environment variable holding the key requests must carry (default: no key needed)")
    args = parser.parse_args(argv)
    if args.max_batch < 1:
        parser.error("--max-batch must be >= 1")
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
    # access_log off: request lines are not needed, and nothing about a request (headers included) is logged.
    uvicorn.run(create_app(chat, api_key=api_key), host=args.host, port=args.port, log_level="warning",
                access_log=False)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
