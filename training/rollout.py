"""Playing SQLEnv episodes with a causal LM: action parsing, chat rendering, batched multi-turn generation,
the legacy `rollout_func` path of GRPOTrainer, and `build_trainer`.

The conversation is rendered exactly as TRL's environment_factory tool loop renders it: the prompt with the
chat template and tool schemas, then each generated turn followed by the tool result's template tokens
(computed like `GRPOTrainer._get_tool_suffix_ids`), so a model trained on one path plays the other, and evals
(`training.policy`) see what training saw.

`rollout_func(prompts, trainer)` plays every episode of a generation batch at once: one `model.generate` per
turn for all live episodes (left-padded), which is what makes it several times faster than playing episodes
one after another. It returns `prompt_ids`, `completion_ids`, `logprobs` (None: TRL recomputes them),
`env_mask` (1 on model tokens, 0 on tool-result tokens) and the reward fields read by `training.rewards`.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from sqlenv.types import ACTION_TYPES, SQLAction, SQLObservation
from training.prompts import episode_over_message, fit_context, initial_messages, tool_call_to_action

__all__ = [
    "parse_model_output",
    "ChatRenderer",
    "Episode",
    "play_batched",
    "rollout_func",
    "build_trainer",
    "grpo_args",
]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_LEGACY = re.compile(r"^\s*(?:\*\*)?(" + "|".join(ACTION_TYPES) + r")(?:\*\*)?\s*[:\s]\s*(.*)$", re.DOTALL | re.I)
_FENCE = re.compile(r"^```[A-Za-z]*\n?(.*?)\n?```$", re.DOTALL)


# ---------------------------------------------------------------------------------------------- parsing
def parse_model_output(text: str) -> SQLAction:
    """The action in a model turn.

    Understands a Qwen3 tool call (`<tool_call>{"name": "query", "arguments": {"sql": ...}}</tool_call>`) and
    the legacy `ACTION_TYPE: argument` text (`QUERY: SELECT ...`, `answer 42`). Anything else becomes a QUERY
    with the raw text, so the environment answers with an SQL error observation instead of the run crashing.
    """
    text = "" if text is None else str(text)
    body = _THINK.sub("", text).replace("<|im_end|>", "").strip()
    match = _TOOL_CALL.search(body)
    if match:
        try:
            call = json.loads(match.group(1))
            if isinstance(call, dict) and "name" in call:
                return tool_call_to_action(call["name"], call.get("arguments", {}))
        except (json.JSONDecodeError, TypeError):
            pass
    legacy = _LEGACY.match(body)
    if legacy:
        argument = legacy.group(2).strip()
        fenced = _FENCE.match(argument)
        if fenced:
            argument = fenced.group(1).strip()
        return SQLAction(legacy.group(1).upper(), argument)
    fenced = _FENCE.match(body)
    return SQLAction("QUERY", fenced.group(1).strip() if fenced else body)


def message_actions(message: dict[str, Any]) -> list[tuple[str, SQLAction]]:
    """(tool name, action) for each tool call of a parsed assistant message; the text fallback otherwise."""
    calls = message.get("tool_calls") or []
    actions = []
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        name = str(function.get("name", ""))
        actions.append((name, tool_call_to_action(name, function.get("arguments", {}))))
    if actions:
        return actions
    action = parse_model_output(message.get("content", ""))
    from training.prompts import TOOL_FOR_ACTION

    return [(TOOL_FOR_ACTION.get(action.action_type, (action.action_type.lower(), ""))[0], action)]


# -------------------------------------------------------------------------------------------- rendering
class ChatRenderer:
    """Renders SQLEnv conversations to token ids the way GRPOTrainer's tool loop does.

    Args:
        tokenizer: the model's tokenizer (its chat template must support tools, e.g. Qwen3's).
        tools: tool callables or schemas (default: `SQLEnvTRL`'s tools, in TRL's order).
        chat_template: the template to render with; default: TRL's training variant when the tokenizer's own
            template is not prefix-preserving (Qwen3's is not), as GRPOTrainer does.
        chat_template_kwargs: extra template variables, e.g. `{"enable_thinking": False}`.
    """

    def __init__(self, tokenizer: Any, tools: list | None = None, chat_template: str | None | bool = True,
                 chat_template_kwargs: dict[str, Any] | None = None):
        from trl.chat_template_utils import (
            add_response_schema,
            get_training_chat_template,
            is_chat_template_prefix_preserving,
        )

        from training.trl_env import tool_methods

        self.tokenizer = tokenizer
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
    def from_trainer(cls, trainer: Any) -> "ChatRenderer":
        """The renderer a running GRPOTrainer uses (same template, kwargs, tools and eos ids)."""
        renderer = cls(trainer.processing_class, tools=None, chat_template=trainer.chat_template,
                       chat_template_kwargs=trainer.chat_template_kwargs)
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

        return parse_response(self.tokenizer, ids, prefix=prefix, tools=self.tools)

    def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        return len(self.prompt_ids(messages))


# ------------------------------------------------------------------------------------ batched episodes
StepFn = Callable[[SQLAction], tuple[str, SQLObservation, bool]]


@dataclass
class Episode:
    """One episode being played: its conversation, its token record and how to step its environment.

    `step(action) -> (tool_text, observation, done)`. `completion_ids`/`env_mask` are the training record
    (everything generated or inserted after `prompt_ids`); `messages` is the readable conversation.
    """

    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    step: StepFn
    observation: SQLObservation | None = None
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    context_ids: list[int] | None = None  # what the model conditions on when the context was trimmed
    done: bool = False
    truncated: bool = False
    turns: int = 0
    actions: list[SQLAction] = field(default_factory=list)

    def input_ids(self) -> list[int]:
        if self.context_ids is not None:
            return self.context_ids
        return self.prompt_ids + self.completion_ids


def _plain_sampling(generation_config: Any) -> float | None:
    """The temperature when `generation_config` only samples with a temperature (what TRL uses by default),
    so the lean decoder reproduces it; None when it asks for more (top-p/k, min-p, penalties...)."""
    if generation_config is None:
        return None
    top_k = getattr(generation_config, "top_k", None)
    neutral = (
        getattr(generation_config, "do_sample", False)
        and getattr(generation_config, "top_p", None) in (None, 1.0)
        and top_k in (None, 0)
        and getattr(generation_config, "min_p", None) in (None, 0.0)
        and getattr(generation_config, "repetition_penalty", None) in (None, 1.0)
        and not any(getattr(generation_config, name, None) for name in (
            "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "bad_words_ids", "no_repeat_ngram_size",
            "forced_bos_token_id", "forced_eos_token_id", "min_new_tokens", "typical_p", "epsilon_cutoff",
            "eta_cutoff"))
    )
    return float(generation_config.temperature or 1.0) if neutral else None


def _generate_lean(model: Any, sequences: list[list[int]], pad_id: int, max_new_tokens: int,
                   eos_ids: set[int], sample: bool, temperature: float) -> list[list[int]]:
    """Batched decoding with a KV cache that drops each row as soon as it ends (EOS), so short turns stop
    costing compute while long ones finish — what makes batching many episodes pay. Greedy or plain
    temperature sampling. Returns each row's new tokens, up to and including its EOS."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    n, width = len(sequences), max(len(s) for s in sequences)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        attention[i, width - len(seq):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    eos = torch.tensor(sorted(eos_ids), device=device)
    results: list[list[int]] = [[] for _ in range(n)]
    rows = torch.arange(n, device=device)
    cache = DynamicCache()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention, past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1, :]
        for step in range(max_new_tokens):
            if sample:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                token = torch.multinomial(probs, 1).squeeze(1)
            else:
                token = logits.argmax(dim=-1)
            for row, value in zip(rows.tolist(), token.tolist()):
                results[row].append(value)
            finished = torch.isin(token, eos)
            if step == max_new_tokens - 1 or bool(finished.all()):
                break
            if bool(finished.any()):
                keep = (~finished).nonzero().squeeze(1)
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
                rows, token, attention = rows[keep], token[keep], attention[keep]
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
            logits = model(input_ids=token[:, None], attention_mask=attention, past_key_values=cache,
                           use_cache=True).logits[:, -1, :]
    return results


def _generate(model: Any, sequences: list[list[int]], pad_id: int, max_new_tokens: int,
              generation_config: Any = None, sample: bool = True, temperature: float = 1.0,
              eos_ids: set[int] | None = None) -> list[list[int]]:
    """One batched generation over left-padded `sequences`; returns the new tokens of each.

    Uses the lean decoder for greedy or plain temperature sampling (TRL's default settings), and
    `model.generate` with `generation_config` for anything else.
    """
    import torch

    if eos_ids:
        if generation_config is None:
            return _generate_lean(model, sequences, pad_id, max_new_tokens, eos_ids, sample, temperature)
        plain = _plain_sampling(generation_config)
        if plain is not None:
            return _generate_lean(model, sequences, pad_id, max_new_tokens, eos_ids, True, plain)

    device = next(model.parameters()).device
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        attention[i, width - len(seq):] = 1
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if generation_config is not None:
        config = copy.deepcopy(generation_config)
        config.max_new_tokens = max_new_tokens
        kwargs = {"generation_config": config}
    elif sample:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, pad_token_id=pad_id)
    else:
        kwargs.update(do_sample=False, pad_token_id=pad_id)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
    return out[:, width:].tolist()


def play_batched(
    model: Any,
    renderer: ChatRenderer,
    episodes: list[Episode],
    *,
    max_turn_tokens: int = 256,
    max_completion_tokens: int | None = None,
    max_context_tokens: int | None = None,
    max_turns: int = 64,
    generation_config: Any = None,
    sample: bool = True,
    temperature: float = 1.0,
) -> list[Episode]:
    """Play `episodes` to the end together: each turn, one `generate` for every live episode.

    A turn's tool calls are run in order (a turn without one is parsed as legacy text, see
    `parse_model_output`). An episode ends when its environment says done, when its record would exceed
    `max_completion_tokens` (training: like TRL, the sample stops as it is), or after `max_turns` turns. With
    `max_context_tokens` (evals) an over-long conversation is trimmed by `prompts.fit_context` instead.
    """
    pad_id = renderer.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = renderer.tokenizer.eos_token_id
    eos = set(renderer.eos_token_ids)
    while True:
        live = [e for e in episodes if not e.done]
        if not live:
            break
        budgets = []
        for e in live:
            room = max_turn_tokens
            if max_completion_tokens is not None:
                room = min(room, max_completion_tokens - len(e.completion_ids))
            if max_context_tokens is not None:
                if len(e.input_ids()) + room > max_context_tokens and e.observation is not None:
                    trimmed = fit_context(e.messages, e.observation, renderer.count_tokens,
                                          max(1, max_context_tokens - max_turn_tokens))
                    e.context_ids = renderer.prompt_ids(trimmed)
                room = min(room, max_context_tokens - len(e.input_ids()))
            budgets.append(room)
        for e, room in list(zip(live, budgets)):
            if room <= 0:
                e.done, e.truncated = True, True
        pairs = [(e, room) for e, room in zip(live, budgets) if room > 0]
        if not pairs:
            break
        outputs = _generate(model, [e.input_ids() for e, _ in pairs], pad_id, max(r for _, r in pairs),
                            generation_config=generation_config, sample=sample, temperature=temperature,
                            eos_ids=eos)
        for (e, room), new in zip(pairs, outputs):
            new = new[:room]
            stop = next((i for i, t in enumerate(new) if t in eos), None)
            ended = stop is not None
            if ended:
                new = new[: stop + 1]
            prefix = e.input_ids()
            e.completion_ids += new
            e.env_mask += [1] * len(new)
            if e.context_ids is not None:
                e.context_ids = e.context_ids + new
            e.turns += 1
            message = renderer.parse(new, prefix=prefix) if new else {"role": "assistant", "content": ""}
            e.messages.append(message)
            tool_messages = []
            for name, action in message_actions(message):
                e.actions.append(action)
                name = name or action.action_type.lower()
                if e.done:  # a further call in the turn that ended the episode
                    tool_messages.append({"role": "tool", "name": name, "content": episode_over_message()})
                    continue
                text, obs, done = e.step(action)
                e.observation, e.done = obs, done
                tool_messages.append({"role": "tool", "name": name, "content": text})
            e.messages.extend(tool_messages)
            if e.done:
                continue
            if not ended:
                if max_completion_tokens is not None:  # training: stop the sample as it is, as TRL does
                    e.done, e.truncated = True, True
                    continue
                e.completion_ids.append(renderer.tokenizer.eos_token_id)  # eval: close the turn, play on
                e.env_mask.append(0)
                if e.context_ids is not None:
                    e.context_ids = e.context_ids + [renderer.tokenizer.eos_token_id]
            if e.turns >= max_turns:
                e.done = True
                continue
            suffix = renderer.tool_suffix_ids(tool_messages)
            if max_completion_tokens is not None and len(e.completion_ids) + len(suffix) >= max_completion_tokens:
                e.done, e.truncated = True, True  # the tool result would not fit: end as TRL does
                continue
            e.completion_ids += suffix
            e.env_mask += [0] * len(suffix)
            if e.context_ids is not None:
                e.context_ids = e.context_ids + suffix
    return episodes


# ------------------------------------------------------------------------------------------ rollout_func
_POOL: list[Any] = []
_POOL_LOCK = threading.Lock()


def _env_pool(n: int) -> list[Any]:
    from training.trl_env import SQLEnvTRL

    with _POOL_LOCK:
        while len(_POOL) < n:
            _POOL.append(SQLEnvTRL())
        return _POOL[:n]


_QUESTION_LINE = re.compile(r"^Question: (.*)$", re.M)
_TABLES_LINE = re.compile(r"^Tables: (.*)$", re.M)


class _QuestionIndex:
    """Finds the question a rollout prompt asks (rollout_func receives only the prompts): by its question
    text, and by its table list when two databases share a question text. Built once per questions file."""

    def __init__(self) -> None:
        self._key = None
        self._by_text: dict[str, list[Any]] = {}
        self._tables: dict[str, str] = {}

    def lookup(self, env: Any, user_text: str) -> str | None:
        from training.trl_env import SQLEnvTRL

        key = SQLEnvTRL.settings()["questions_path"]
        inner = env._environment()
        if key != self._key:
            self._by_text, self._tables = {}, {}
            for q in inner.questions:
                self._by_text.setdefault(q.question_text.strip(), []).append(q)
            self._key = key
        m = _QUESTION_LINE.search(user_text or "")
        if not m:
            return None
        candidates = self._by_text.get(m.group(1).strip(), [])
        databases = {q.database_name for q in candidates}
        if len(databases) > 1:
            tables = _TABLES_LINE.search(user_text)
            for q in candidates:
                if q.database_name not in self._tables:
                    try:
                        self._tables[q.database_name] = ", ".join(inner.sandbox.table_names(q.database_name))
                    except Exception:  # noqa: BLE001 - a broken database just doesn't match
                        self._tables[q.database_name] = ""
                if tables and self._tables[q.database_name] == tables.group(1).strip():
                    return q.question_id
        return candidates[0].question_id if candidates else None


_INDEX = _QuestionIndex()


def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
    """GRPOTrainer's `rollout_func`: play one episode per prompt, batched, and return the training record.

    Each prompt is `[system, user]` where the user turn is the episode's first observation (see
    `rollout_rows`); the question is found from its text. Uses the data set by `SQLEnvTRL.configure`.
    """
    from trl.models import unwrap_model_for_generation

    renderer = getattr(trainer, "_sqlenv_renderer", None)
    if renderer is None:
        renderer = ChatRenderer.from_trainer(trainer)
        trainer._sqlenv_renderer = renderer
    envs = _env_pool(len(prompts))
    episodes = []
    for prompt, env in zip(prompts, envs):
        user = next((m.get("content", "") for m in reversed(prompt) if m.get("role") == "user"), "")
        question_id = _INDEX.lookup(env, user)
        if question_id is None:
            raise ValueError(f"rollout_func: no configured question matches the prompt {user[:120]!r}")
        env.reset(question_id=question_id)
        messages = copy.deepcopy(list(prompt))

        def step(action: SQLAction, env: Any = env) -> tuple[str, SQLObservation, bool]:
            text = env._act(action.action_type, action.argument)
            return text, env.observation, env.done

        episodes.append(Episode(messages=messages, prompt_ids=renderer.prompt_ids(messages), step=step,
                                observation=env.observation))
    max_turns = trainer.max_tool_calling_iterations if trainer.max_tool_calling_iterations < 10**6 else 64
    max_turn_tokens = getattr(trainer, "_sqlenv_max_turn_tokens", trainer.max_completion_length)
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        play_batched(model, renderer, episodes, max_turn_tokens=max_turn_tokens,
                     max_completion_tokens=trainer.max_completion_length, max_turns=max_turns,
                     generation_config=trainer.generation_config)
    breakdowns = [env.breakdown for env in envs]
    _log_tool_metrics(trainer, episodes)
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": None,
        "env_mask": [e.env_mask for e in episodes],
        "correctness": [b.correctness for b in breakdowns],
        "progress": [b.progress for b in breakdowns],
        "operational": [b.operational for b in breakdowns],
    }


def _log_tool_metrics(trainer: Any, episodes: list[Episode]) -> None:
    """The tool-health metrics TRL logs on the environment path (it cannot see our calls on this path)."""
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None or not episodes:
        return
    mode = "train" if trainer.model.training else "eval"
    calls = sum(len(e.actions) for e in episodes)
    failures = sum(1 for e in episodes for m in e.messages
                   if m.get("role") == "tool" and str(m.get("content", "")).startswith("Error:"))
    metrics[mode]["tools/call_frequency"].append(calls / len(episodes))
    metrics[mode]["tools/failure_frequency"].append(failures / calls if calls else 0.0)


def rollout_rows(questions_path: Any = None, *, dataset: Any = None, split: str = "train", step_budget: int = 10):
    """The GRPO dataset of the rollout path: `[system, user(first observation)]` prompts, one per question."""
    from datasets import Dataset

    from sqlenv.datasets import resolve_dataset
    from sqlenv.environment import SQLEnvironment

    if dataset is not None:
        info = resolve_dataset(dataset)
        questions_path, db_dir = info.questions_path(split), info.db_dir
    else:
        raise ValueError("rollout_rows() needs a dataset")
    env = SQLEnvironment(questions_path, db_dir, step_budget=step_budget)
    try:
        prompts, ids = [], []
        for q in env.questions:
            prompts.append(initial_messages(env.reset(question_id=q.question_id)))
            ids.append(q.question_id)
    finally:
        env.close()
    return Dataset.from_dict({"prompt": prompts, "question_id": ids})


# -------------------------------------------------------------------------------------------- trainer
def grpo_args(config: Any, output_dir: str, **overrides: Any):
    """The `GRPOConfig` for a `TrainConfig` (precision, budgets, logging cadence, reward weights)."""
    import warnings

    from trl import GRPOConfig

    precision = config.resolved_precision()
    device = config.resolved_device()
    kwargs = dict(
        output_dir=output_dir,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=config.num_generations,
        learning_rate=config.resolved_learning_rate(),
        max_steps=config.max_steps if config.max_steps > 0 else -1,
        num_train_epochs=config.num_train_epochs,
        max_completion_length=config.resolved_max_completion_length(),
        max_tool_calling_iterations=config.resolved_max_tool_calling_iterations(),
        beta=config.beta,
        temperature=config.temperature,
        reward_weights=config.resolved_reward_weights(),
        chat_template_kwargs={"enable_thinking": config.enable_thinking},
        # Each turn of TRL's tool loop generates up to max_new_tokens: cap a babbling turn as the rollout path does.
        generation_kwargs={"max_new_tokens": min(config.max_turn_tokens, config.resolved_max_completion_length())},
        seed=config.seed,
        logging_steps=config.plot_every,
        save_strategy="no",
        report_to="none",
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=device == "cpu",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        # Always passed: TRL's GRPOConfig defaults it to True, which would make small CPU runs recompute activations.
        gradient_checkpointing=config.gradient_checkpointing,
    )
    kwargs.update(overrides)
    with warnings.catch_warnings():
        # transformers renamed it `activation_checkpointing`; TRL's configs still define the old name.
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        return GRPOConfig(**kwargs)


def build_trainer(config: Any, model: Any, tokenizer: Any, *, output_dir: str | None = None,
                  callbacks: list | None = None, **grpo_overrides: Any):
    """A GRPOTrainer for `config`: environment_factory (default) or rollout_func (`config.rollout`)."""
    import os
    import warnings

    from trl import GRPOTrainer

    from training.rewards import REWARD_FUNCS
    from training.trl_env import SQLEnvTRL, train_rows

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    SQLEnvTRL.configure(dataset=config.dataset, split=config.train_split, step_budget=config.step_budget)
    args = grpo_args(config, output_dir or str(config.resolved_output_dir()), **grpo_overrides)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    common = dict(model=model, reward_funcs=list(REWARD_FUNCS), args=args, processing_class=tokenizer,
                  callbacks=callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if config.rollout == "rollout_func":
            rows = rollout_rows(dataset=config.dataset, split=config.train_split, step_budget=config.step_budget)
            trainer = GRPOTrainer(train_dataset=rows, rollout_func=rollout_func, **common)
            # TRL only parses tool calls when a response schema is set; the rollout path parses them itself.
            trainer._sqlenv_renderer = ChatRenderer(
                tokenizer, chat_template=True,
                chat_template_kwargs={"enable_thinking": config.enable_thinking},
            )
            trainer._sqlenv_renderer.eos_token_ids = list(trainer.eos_token_ids)
            trainer._sqlenv_max_turn_tokens = config.max_turn_tokens
        else:
            rows = train_rows(dataset=config.dataset, split=config.train_split)
            trainer = GRPOTrainer(train_dataset=rows, environment_factory=SQLEnvTRL, **common)
    ref_model = getattr(trainer, "ref_model", None)
    if ref_model is not None:
        # TRL builds the KL reference from `model.config._name_or_path`, i.e. the weights on disk, not the ones in
        # memory: after an SFT warm-start that is the random-init model. Anchor it to the policy GRPO starts from.
        ref_model.load_state_dict(trainer.accelerator.unwrap_model(trainer.model).state_dict())
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # raw log dicts on stdout; progress goes through the run callback
    return trainer
