"""`ChatRenderer`: renders SQLEnv conversations to token ids exactly as GRPOTrainer's tool loop does.

The prompt is rendered with the chat template and the tool schemas; each generated turn is followed by the tool
result's template tokens, computed like `GRPOTrainer._get_tool_suffix_ids`. So a model trained on one rollout path
plays the other, and evals (`training.generation.model_policy`) see what training saw. With the compact prompt
(`sqlenv.agent.prompts.PROMPTS`) no tool schemas are rendered: the system prompt names the tools itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChatRenderer"]


class ChatRenderer:
    """Renders SQLEnv conversations to token ids the way GRPOTrainer's tool loop does.

    Args:
        tokenizer: the model's tokenizer (its chat template must support tools, e.g. Qwen3's).
        tools: tool callables or schemas (default: `SQLEnvTRL`'s tools, in TRL's order; none with the compact prompt).
        chat_template: the template to render with; default: TRL's training variant when the tokenizer's own
            template is not prefix-preserving (Qwen3's is not), as GRPOTrainer does.
        chat_template_kwargs: extra template variables, e.g. `{"enable_thinking": False}`.
        prompt: the prompt the conversations start with (`sqlenv.agent.prompts.PROMPTS`): `"full"` (default) renders the
            tool schemas after the system prompt, `"compact"` none (`TrainConfig.prompt`; training, the warm start and
            evals must agree).
    """

    def __init__(self, tokenizer: Any, tools: list | None = None, chat_template: str | None | bool = True,
                 chat_template_kwargs: dict[str, Any] | None = None, prompt: str = "full"):
        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        from sqlenv.agent.prompts import renders_tool_schemas
        from training.environment.trl_env import tool_methods

        self.tokenizer = tokenizer
        self.prompt = prompt
        if not renders_tool_schemas(prompt):
            if tools:
                raise ValueError(f"prompt={prompt!r} renders no tool schemas: pass no tools")
            tools = []
        self.tools = tools if tools is not None else tool_methods()
        if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
            add_response_schema(tokenizer)
        if chat_template is True:  # auto, as GRPOTrainer.__init__
            chat_template = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
        self.chat_template = chat_template or None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        eos = [tokenizer.eos_token_id]
        self.eos_token_ids = eos
        self._suffix_cache: dict[tuple, list[int]] = {}

    @classmethod
    def from_trainer(cls, trainer: Any, prompt: str = "full") -> "ChatRenderer":
        """The renderer a running GRPOTrainer uses (same template, kwargs, tools and eos ids) for `prompt`."""
        renderer = cls(trainer.processing_class, tools=None, chat_template=trainer.chat_template,
                       chat_template_kwargs=trainer.chat_template_kwargs, prompt=prompt)
        renderer.eos_token_ids = list(trainer.eos_token_ids)
        return renderer

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, tools=self.tools or None, chat_template=self.chat_template, add_generation_prompt=True,
            tokenize=True, return_dict=False, **self.chat_template_kwargs,
        )
        return list(ids)

    def tool_suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Token ids that follow a turn's EOS: the tool results and the next assistant header (as TRL)."""
        key = tuple((m["name"], m["content"]) for m in tool_messages)
        cached = self._suffix_cache.get(key)
        if cached is not None:
            return list(cached)
        dummy = [
            {"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]},
        ]
        render = dict(tokenize=True, chat_template=self.chat_template, return_dict=False, **self.chat_template_kwargs)
        prefix = list(self.tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **render))
        full = list(self.tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, **render))
        eos_positions = [i for i, t in enumerate(prefix) if t == self.tokenizer.eos_token_id]
        if eos_positions:
            prefix = prefix[: eos_positions[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("chat template is not prefix-preserving: cannot append tool results")
        suffix = full[len(prefix):]
        if len(self._suffix_cache) < 4096:
            self._suffix_cache[key] = suffix
        return list(suffix)

    def parse(self, ids: list[int], prefix: list[int] | None = None) -> dict[str, Any]:
        from trl.chat_template_utils import parse_response

        return parse_response(self.tokenizer, ids, prefix=prefix, tools=self.tools or None)

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        return len(self.prompt_ids(messages))

