"""`ModelPolicy`: a causal LM playing SQLEnv, for evals, traces and the random-vs-trained comparison.

It follows the sqlenv Policy protocol (`name`, `reset(env, observation)`, `act(env, observation)`), so
`sqlenv.evaluate` plays it like the random and oracle policies, and renders the conversation
exactly as GRPO does (`training.generation.chat.ChatRenderer`: chat template with the tool schemas, tool results
appended as TRL appends them). Over-long conversations are trimmed by `sqlenv.agent.prompts.fit_context`.

`evaluate_model(...)` plays many episodes at once (one `generate` per turn for all of them) with the same
seeding as `evaluate` — episode i is `env.reset(seed=seed + i)` — so its transcripts pair with the random
policy's, and it is several times faster than one episode at a time.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlenv.types import SQLAction, SQLObservation
from sqlenv.agent.model_output import message_actions
from training.generation.chat import ChatRenderer
from training.generation.decoding import generate_new_tokens
from training.generation.episodes import Episode, play_batched
from training.generation.decoders import decode_dtype, kept_cache_decoder
from sqlenv.agent.prompts import format_tool_result, initial_messages

__all__ = ["ModelPolicy", "evaluate_model", "play_model_episodes"]


def _context_limit(model: Any, max_turn_tokens: int) -> int:
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 4096
    return max(256, int(limit))


class ModelPolicy:
    """A trained (or base) model as an SQLEnv policy.

    Args:
        model: a causal LM (`transformers` model).
        tokenizer: its tokenizer (chat template with tool support, e.g. Qwen3's).
        name: the policy's name in transcripts (default `"model"`).
        max_turn_tokens: most tokens per generated turn (default 256).
        temperature: 0 (default) decodes greedily, so an eval is repeatable; > 0 samples.
        enable_thinking: as in `TrainConfig` (default False); must match training.
        max_context_tokens: conversation budget; default: the model's context length.
        prompt: the prompt episodes start with (`sqlenv.agent.prompts.PROMPTS`, default `"full"`); must match training.
    """

    def __init__(self, model: Any, tokenizer: Any, name: str = "model", *, max_turn_tokens: int = 256,
                 temperature: float = 0.0, enable_thinking: bool = False, max_context_tokens: int | None = None,
                 prompt: str = "full"):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.max_turn_tokens = max_turn_tokens
        self.temperature = temperature
        self.prompt = prompt
        self.renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": enable_thinking},
                                     prompt=prompt)
        self.max_context_tokens = max_context_tokens or _context_limit(model, max_turn_tokens)
        self.messages: list[dict[str, Any]] = []
        self._ids: list[int] = []
        self._pending: list[tuple[str, SQLAction]] = []  # further tool calls of the current turn
        self._awaiting: list[str] = []  # tool names whose results the next observations carry
        self._results: list[dict[str, Any]] = []  # tool messages of the current turn
        #: The decoder that keeps the conversation's KV cache from turn to turn (`kept_cache_decoder`; None before
        #: the first turn, or when the model's cache cannot be kept: then every turn re-reads the conversation).
        self.decoder: Any = None

    def reset(self, env: Any, observation: SQLObservation) -> None:
        self.messages = initial_messages(observation, self.prompt)
        self._ids = self.renderer.prompt_ids(self.messages)
        self._pending, self._awaiting, self._results = [], [], []
        if self.decoder is not None:
            self.decoder.forget()

    def act(self, env: Any, observation: SQLObservation) -> SQLAction:
        if not self.messages:
            self.reset(env, observation)
        if self._awaiting:  # `observation` is the result of the action returned last
            name = self._awaiting.pop(0)
            self._results.append({"role": "tool", "name": name, "content": format_tool_result(observation)})
        if not self._pending:
            self._pending = self._next_turn(observation)
        name, action = self._pending.pop(0)
        self._awaiting.append(name)
        return action

    def _next_turn(self, observation: SQLObservation) -> list[tuple[str, SQLAction]]:
        from sqlenv.agent.prompts import fit_context

        if self._results:
            self.messages.extend(self._results)
            self._ids = self._ids + self.renderer.tool_suffix_ids(self._results)
            self._results = []
        if len(self._ids) + self.max_turn_tokens > self.max_context_tokens:
            trimmed = fit_context(self.messages, observation, self.renderer.count_tokens,
                                  max(1, self.max_context_tokens - self.max_turn_tokens))
            self._ids = self.renderer.prompt_ids(trimmed)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        was_training = getattr(self.model, "training", False)
        self.model.eval()
        eos = set(self.renderer.eos_token_ids)
        if self.decoder is None and eos:
            self.decoder = kept_cache_decoder(self.model, pad, eos)
        try:
            if self.decoder is not None:
                new = self.decoder.generate({0: self._ids}, self.max_turn_tokens, sample=self.temperature > 0,
                                             temperature=self.temperature or 1.0)[0]
            else:
                new = generate_new_tokens(self.model, [self._ids], pad, self.max_turn_tokens,
                                          sample=self.temperature > 0, temperature=self.temperature or 1.0,
                                          eos_ids=eos)[0]
        finally:
            if was_training:
                self.model.train()
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        new = new[: stop + 1] if stop is not None else new + [self.tokenizer.eos_token_id]
        message = self.renderer.parse(new, prefix=self._ids) if new else {"role": "assistant", "content": ""}
        self._ids = self._ids + new
        self.messages.append(message)
        return [(name or action.action_type.lower(), action) for name, action in message_actions(message)]


# ------------------------------------------------------------------------------------ batched evaluation
def play_model_episodes(model: Any, tokenizer: Any, envs: list[Any], observations: list[SQLObservation], *,
                        max_turn_tokens: int = 256, temperature: float = 0.0, enable_thinking: bool = False,
                        renderer: ChatRenderer | None = None, keep_cache: bool = True,
                        prompt: str | None = None, decoder: Any = None,
                        precision: str | None = None) -> list[Episode]:
    """Play one episode per environment (already reset, with its first observation) to the end, batched
    (`keep_cache`: each episode keeps its KV cache across turns, see `play_batched`; `decoder` passes the kept-cache
    decoder in). `prompt` (`sqlenv.agent.prompts.PROMPTS`) defaults to the renderer's, else `"full"`. `precision`
    (a run's resolved precision; default None: the weights' dtype): "bf16" plays an fp32 model as its trainer's bf16
    autocast computes (`decoders.decode_dtype`)."""
    prompt = prompt or (renderer.prompt if renderer is not None else "full")
    renderer = renderer or ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": enable_thinking},
                                        prompt=prompt)
    if renderer.prompt != prompt:
        raise ValueError(f"the renderer renders prompt={renderer.prompt!r}, the episodes start with {prompt!r}")
    episodes = []
    for env, obs in zip(envs, observations):
        messages = initial_messages(obs, prompt)

        def step(action: SQLAction, env: Any = env):
            obs = env.step(action)
            return format_tool_result(obs), obs, obs.done

        episodes.append(Episode(messages=messages, prompt_ids=renderer.prompt_ids(messages), step=step,
                                observation=obs))
    budget = max((getattr(env, "step_budget", 15) for env in envs), default=15)
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        play_batched(model, renderer, episodes, max_turn_tokens=max_turn_tokens,
                     max_context_tokens=_context_limit(model, max_turn_tokens), max_turns=budget + 2,
                     sample=temperature > 0, temperature=temperature or 1.0, keep_cache=keep_cache,
                     decoder=decoder, compute_dtype=decode_dtype(precision, model))
    finally:
        if was_training:
            model.train()
    return episodes


def evaluate_model(model: Any, tokenizer: Any, *, dataset: str = "builtin", split: str = "eval",
                   n_episodes: int = 3, seed: int = 0, step_budget: int = 10, name: str = "model",
                   max_turn_tokens: int = 256, temperature: float = 0.0, enable_thinking: bool = False,
                   batch_size: int = 32, envs: list[Any] | None = None, prompt: str = "full",
                   question_ids: Sequence[str] | None = None, precision: str | None = None):
    """Evaluate a model like `sqlenv.evaluate` (episode i = `reset(seed=seed + i)`), batched.

    With `question_ids`, episode i plays question `question_ids[i]` instead (a fixed panel: `n_episodes` is then
    their number).

    `dataset` is a name, a prepared directory or a resolved `DatasetInfo` (a run passes its plan's); `envs`, when
    given, are played instead (already open; the caller closes them). `prompt` is the prompt the model was trained
    on (`TrainConfig.prompt`, default `"full"`). `precision`: the run's resolved precision, so the model plays as it
    trains (see `play_model_episodes`; default None: the weights' dtype).

    Returns an `EvaluationResult` whose episodes are transcripts with `policy` and `seed` filled. A batch that
    raises (out of memory, a broken model) raises here: its episodes are not scored as failures.
    """
    from sqlenv.evaluation.evaluate import EvaluationResult
    from sqlenv.data.datasets import resolve_dataset
    from sqlenv.environment import SQLEnvironment

    if question_ids is not None:
        question_ids = list(question_ids)
        n_episodes = len(question_ids)
    own = envs is None
    if own:
        info = resolve_dataset(dataset)  # once, not per environment
        envs = [SQLEnvironment.from_dataset(info, split, step_budget=step_budget)
                for _ in range(min(batch_size, max(1, n_episodes)))]
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": enable_thinking}, prompt=prompt)
    transcripts: list[dict] = []
    try:
        for start in range(0, n_episodes, len(envs)):
            chunk = list(range(start, min(n_episodes, start + len(envs))))
            used = envs[: len(chunk)]
            observations = [env.reset(seed=seed + i) if question_ids is None
                            else env.reset(seed=seed + i, question_id=question_ids[i]) for env, i in zip(used, chunk)]
            # A batch that raises ends the eval with its error (scored as failed episodes, a crash would read as a
            # model that unlearned); the caller records it (training.callbacks, training.evals, training.validation).
            play_model_episodes(model, tokenizer, used, observations, max_turn_tokens=max_turn_tokens,
                                temperature=temperature, renderer=renderer, precision=precision)
            for env, i in zip(used, chunk):
                transcript = env.transcript()
                transcript["policy"] = name
                transcript["seed"] = seed + i
                transcripts.append(transcript)
    finally:
        if own:
            for env in envs:
                env.close()
    return EvaluationResult.from_episodes(transcripts, policy=name, seed=seed)
