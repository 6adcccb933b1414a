"""`OpenAIPolicy`: any chat model behind an OpenAI-compatible endpoint (vLLM, `transformers serve`, a hosted API,
`python -m training.generation.openai_server`) playing SQLEnv through the same four tools the trained model calls.

The model reads what GRPO's model reads (`sqlenv.agent.prompts`: the system prompt, the first user turn, the tool
results) and calls `describe` / `sample` / `query` / `answer` (`TOOLS`, the JSON schemas TRL builds from
`training.environment.trl_env.SQLEnvTRL`'s methods). A turn without a tool call is read as `ACTION: argument` text,
as every model path here reads it (`sqlenv.agent.model_output.parse_model_output`), so the environment answers with
an error observation instead of the run crashing.

    settings = EndpointSettings(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-0.6B")
    result = evaluate_concurrently(lambda: SQLEnvironment.from_dataset("builtin", "eval"),
                                   lambda: OpenAIPolicy(settings), n_episodes=50, concurrency=8)

Requests go through the `openai` client (extra `openai`), whose retries with exponential backoff (connection
errors, 408/409/429/5xx, honouring Retry-After) and per-request timeout are the ones used. The API key is read
from an environment variable only and is never part of a transcript, a result or an error message. Failures that
make every further request pointless (unreachable, key refused, unknown model, tools not supported) raise
`EndpointError` and are kept in `fatal_error`, so `sqlenv.evaluation.concurrent` stops the run with one line.

No ML imports: `sqlenv.agent.prompts` and `sqlenv.agent.model_output` are plain text and the standard library.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlenv.types import SQLAction, SQLObservation

__all__ = ["EndpointError", "EndpointSettings", "OpenAIPolicy", "TOOLS", "OPENAI_TOOLS", "redact_url"]


def _tool(name: str, description: str, argument: str, argument_description: str) -> dict[str, Any]:
    properties = {argument: {"type": "string", "description": argument_description}}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": [argument]},
        "return": {"type": "string"}}}


#: The tools exactly as training renders them: what `transformers.utils.get_json_schema` makes of `SQLEnvTRL`'s tool
#: methods (`training.environment.trl_env.tool_schemas()`, in TRL's order), spelled out so this module needs no
#: transformers; tests/test_openai_policy.py checks the two agree. Exactness matters: the tiny model's tokenizer
#: learned the rendered tool block as a few tokens, and one changed character makes it hundreds the model has never
#: seen.
TOOLS: list[dict[str, Any]] = [
    _tool("answer", "Submit the final answer; this ends the episode.", "value",
          "The answer in the format of the system prompt."),
    _tool("describe", "Show the columns of a table (types, keys) and its row count.", "table_name", "A table name."),
    _tool("query", "Run one read-only SQLite SELECT statement.", "sql", "The SELECT statement."),
    _tool("sample", "Show the first rows of a table.", "table_name", "A table name."),
]

#: `TOOLS` in OpenAI's own function format: without the "return" entry that `get_json_schema` adds, for endpoints
#: that validate function schemas strictly (`EndpointSettings(tool_schemas="openai")`, `--tool-schemas openai`).
OPENAI_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {k: v for k, v in tool["function"].items() if k != "return"}} for tool in TOOLS
]


class EndpointError(RuntimeError):
    """The endpoint cannot be used at all (unreachable, key refused, unknown model, no tool calling); the message
    is one line without the API key."""


def redact_url(url: str) -> str:
    """`url` without user:password, so it can be shown and stored."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class EndpointSettings:
    """Where the model is and how to ask it; resolved once (the CLI's flags) and shared by every episode.

    Args:
        base_url: the API root, e.g. `http://127.0.0.1:8000/v1` (vLLM, `transformers serve`,
            `python -m training.generation.openai_server`) or `https://api.openai.com/v1`.
        model: the model name the endpoint serves, e.g. `Qwen/Qwen3-0.6B`.
        api_key_env: the environment variable holding the API key (default `OPENAI_API_KEY`). Unset is fine for
            local servers that need no key (a placeholder is sent). Keys are never taken as arguments, so they
            cannot land in shell history, run files or logs.
        timeout: seconds one request may take before it is retried or fails (default 60).
        max_retries: retries of a failed request, with the client's exponential backoff (default 2).
        temperature: sampling temperature (default 0.0: greedy, so evaluations repeat).
        max_tokens: most tokens per model turn (default 512).
        tool_schemas: "training" (default): the tool schemas exactly as training renders them (`TOOLS`), what a
            model trained here knows, accepted by servers that hand them to the chat template (vLLM, `transformers
            serve`); "openai": without the non-standard "return" entry (`OPENAI_TOOLS`), for strict endpoints.
        chat_template_kwargs: template variables sent with each request as `chat_template_kwargs` (vLLM,
            `transformers serve` and `training.generation.openai_server` read it), e.g. `{"enable_thinking": False}` to render
            Qwen3's turns as training does. Default None: nothing is sent (hosted APIs refuse unknown fields).
        prompt: the prompt episodes start with (`sqlenv.agent.prompts.PROMPTS`): "full" (default) sends the tools with
            each request; "compact" (a model trained with `TrainConfig.prompt="compact"`) sends its system prompt, which
            names the tools, and no tools: the reply's `<tool_call>` comes back as a tool call where the endpoint
            parses one without tools (`training.generation.openai_server`), else as text (`parse_model_output`).
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout: float = 60.0
    max_retries: int = 2
    temperature: float = 0.0
    max_tokens: int = 512
    tool_schemas: str = "training"
    chat_template_kwargs: dict[str, Any] | None = None
    prompt: str = "full"

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base URL must be http(s)://host[:port]/..., got {redact_url(self.base_url)!r}")
        if not self.model.strip():
            raise ValueError("model name is empty")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.tool_schemas not in ("training", "openai"):
            raise ValueError(f"tool_schemas must be 'training' or 'openai', got {self.tool_schemas!r}")
        if self.chat_template_kwargs is not None and not isinstance(self.chat_template_kwargs, dict):
            raise ValueError(f"chat_template_kwargs must be a JSON object, got {self.chat_template_kwargs!r}")
        from sqlenv.agent.prompts import PROMPTS

        if self.prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {list(PROMPTS)}, got {self.prompt!r}")

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas sent with every request (see `tool_schemas`; none with the compact prompt)."""
        from sqlenv.agent.prompts import renders_tool_schemas

        if not renders_tool_schemas(self.prompt):
            return []
        return TOOLS if self.tool_schemas == "training" else OPENAI_TOOLS

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def client(self) -> Any:
        """An `openai.OpenAI` client for this endpoint (one per policy: it holds a connection pool)."""
        try:
            from openai import OpenAI
        except ImportError:
            raise EndpointError("the openai policy needs the openai client: pip install 'sqlenv[openai]'") from None
        # The client insists on a key; local servers ignore it, so a placeholder stands in when none is set.
        return OpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=self.timeout,
                      max_retries=self.max_retries)

    def describe(self) -> dict[str, Any]:
        """What may be stored beside a result: the endpoint without credentials, never the key."""
        return {"base_url": redact_url(self.base_url), "model": self.model, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "tool_schemas": self.tool_schemas,
                "chat_template_kwargs": self.chat_template_kwargs, "prompt": self.prompt}


class OpenAIPolicy:
    """A model behind an OpenAI-compatible chat endpoint as an SQLEnv policy (the `sqlenv.evaluation.policies.Policy`
    protocol). One instance plays one episode at a time; play episodes concurrently with one instance each.

    Args:
        settings: the endpoint, model and request limits (`EndpointSettings`).
        client: an `openai.OpenAI`-like client to use instead of `settings.client()`.

    After each episode `episode_usage()` gives its requests, tokens (as the endpoint reports them) and the
    seconds spent waiting for the model, which evaluations store in the transcript under "usage".
    """

    def __init__(self, settings: EndpointSettings, client: Any = None):
        self.settings = settings
        self.name = f"openai:{settings.model}"
        self.client = client if client is not None else settings.client()
        self.fatal_error: EndpointError | None = None
        self.messages: list[dict[str, Any]] = []
        self._pending: list[tuple[str | None, SQLAction]] = []  # further tool calls of the current turn
        self._awaiting: str | None = None  # how the next observation is returned: a tool call id, "text" or None
        self._usage = _empty_usage()

    # ------------------------------------------------------------------------------------------- protocol
    def reset(self, env: Any, observation: SQLObservation) -> None:
        from sqlenv.agent.prompts import initial_messages

        self.messages = initial_messages(observation, self.settings.prompt)
        self._pending, self._awaiting = [], None
        self._usage = _empty_usage()

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        from sqlenv.agent.prompts import format_tool_result

        if self._awaiting is not None:
            if self._awaiting == "text":  # the model wrote its action as text: the result comes back as the user
                self.messages.append({"role": "user", "content": format_tool_result(observation)})
            else:
                self.messages.append({"role": "tool", "tool_call_id": self._awaiting,
                                      "content": format_tool_result(observation)})
            self._awaiting = None
        if not self._pending:
            self._pending = self._next_turn()
        call_id, action = self._pending.pop(0)
        self._awaiting = call_id or "text"
        return action

    def episode_usage(self) -> dict[str, Any]:
        """This episode's requests (chat completions asked for; the client's own retries are inside one), the
        prompt/completion/total tokens the endpoint reported, tool calls, text turns and the seconds spent waiting."""
        usage = dict(self._usage)
        usage["latency_s"] = round(usage["latency_s"], 4)
        return usage

    # ------------------------------------------------------------------------------------------- requests
    def _next_turn(self) -> list[tuple[str | None, SQLAction]]:
        """Ask the model for its next turn; the actions in it, each with its tool call id (None for text)."""
        from sqlenv.agent.model_output import parse_model_output
        from sqlenv.agent.prompts import tool_call_to_action

        message = self._complete()
        calls = list(getattr(message, "tool_calls", None) or [])
        content = getattr(message, "content", None) or ""
        assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
        actions: list[tuple[str | None, SQLAction]] = []
        if calls:
            assistant["tool_calls"] = []
            for i, call in enumerate(calls):
                function = getattr(call, "function", None)
                name = str(getattr(function, "name", "") or "")
                raw = getattr(function, "arguments", "") or ""
                call_id = str(getattr(call, "id", "") or f"call_{len(self.messages)}_{i}")
                try:
                    arguments = json.loads(raw) if isinstance(raw, str) else raw
                except json.JSONDecodeError:
                    arguments = raw  # broken JSON: the raw text becomes the argument and the environment says why
                assistant["tool_calls"].append({"id": call_id, "type": "function",
                                                "function": {"name": name, "arguments": raw if isinstance(raw, str)
                                                             else json.dumps(raw)}})
                actions.append((call_id, tool_call_to_action(name, arguments)))
            self._usage["tool_calls"] += len(calls)
        else:
            self._usage["text_turns"] += 1
            actions.append((None, parse_model_output(content)))
        self.messages.append(assistant)
        return actions

    def _complete(self) -> Any:
        """One chat completion with the tools; the assistant message. Endpoint-wide failures raise
        `EndpointError` (and are kept in `fatal_error`); others raise RuntimeError for this episode alone."""
        import openai

        s = self.settings
        extra = {"extra_body": {"chat_template_kwargs": s.chat_template_kwargs}} if s.chat_template_kwargs else {}
        if s.tools:  # none with the compact prompt (an empty list is refused by strict endpoints)
            extra["tools"] = s.tools
        started = time.perf_counter()
        try:
            response = self.client.chat.completions.create(
                model=s.model, messages=self.messages, temperature=s.temperature,
                max_tokens=s.max_tokens, **extra)
        except openai.APITimeoutError:
            raise self._fatal(f"no answer from {redact_url(s.base_url)} within {s.timeout:g} s "
                              f"({s.max_retries} retries)") from None
        except openai.APIConnectionError as exc:
            raise self._fatal(f"cannot reach {redact_url(s.base_url)}: {self._clean(exc.__cause__ or exc)}") from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            where = f"${s.api_key_env}" if s.api_key else f"no key (${s.api_key_env} is not set)"
            raise self._fatal(f"{redact_url(s.base_url)} refused the API key from {where} "
                              f"(HTTP {exc.status_code})") from None
        except openai.NotFoundError as exc:
            raise self._fatal(f"{redact_url(s.base_url)} has no model {s.model!r} or no /chat/completions "
                              f"(HTTP 404: {self._clean(exc)})") from None
        except openai.BadRequestError as exc:
            text = self._clean(exc)
            if _about_tools(text):
                raise self._fatal(f"model {s.model!r} at {redact_url(s.base_url)} cannot call tools: {text}") from None
            raise RuntimeError(f"the endpoint rejected the request (HTTP 400): {text}") from None
        except openai.APIStatusError as exc:
            raise RuntimeError(f"the endpoint failed (HTTP {exc.status_code}): {self._clean(exc)}") from None
        finally:
            self._usage["latency_s"] += time.perf_counter() - started
            self._usage["requests"] += 1
        usage = getattr(response, "usage", None)
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            self._usage[key] += int(getattr(usage, key, 0) or 0)
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise RuntimeError("the endpoint answered with no choices")
        return choices[0].message

    def _fatal(self, message: str) -> EndpointError:
        self.fatal_error = EndpointError(message)
        return self.fatal_error

    def _clean(self, exc: BaseException | str) -> str:
        """An error as one line with the API key (should an endpoint echo it) masked."""
        text = " ".join((str(exc).strip() or type(exc).__name__).split())
        key = self.settings.api_key
        return text.replace(key, "***") if key else text


def _about_tools(message: str) -> bool:
    """Whether a 400 says the endpoint cannot take tools (vLLM without `--enable-auto-tool-choice`, a model without
    tool support), not that the conversation outgrew the context, which fails only its episode."""
    text = message.lower()
    if "context" in text or "too long" in text:
        return False
    return "tool" in text or "function call" in text or "function_call" in text


def _empty_usage() -> dict[str, Any]:
    return {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "tool_calls": 0,
            "text_turns": 0, "latency_s": 0.0}
