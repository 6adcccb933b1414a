"""Playing many SQLEnv episodes together with one causal LM: `Episode` and `play_batched`.

Each turn, one batched generation for every live episode (`training.generation.decoding`), then each episode's tool calls are
run against its environment and the tool results appended as TRL appends them (`training.generation.chat.ChatRenderer`). The
token record (`completion_ids`, `env_mask`: 1 on model tokens, 0 on tool-result tokens) is what GRPO trains on; the
messages are the readable conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sqlenv.types import SQLAction, SQLObservation
from sqlenv.agent.model_output import message_actions
from training.generation.chat import ChatRenderer
from training.generation.decoding import generate_new_tokens, plain_temperature
from training.generation.decoders import kept_cache_decoder
from sqlenv.agent.prompts import episode_over_message, fit_context

__all__ = ["Episode", "StepFn", "play_batched"]

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
    #: the log-probability of each token the kept-cache decoder drew for this episode, under the distribution it drew
    #: it from (empty when greedy, or decoded by `generate`)
    sampled_logprobs: list[float] = field(default_factory=list)

    def input_ids(self) -> list[int]:
        if self.context_ids is not None:
            return self.context_ids
        return self.prompt_ids + self.completion_ids


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
    keep_cache: bool = True,
    decoder: Any = None,
    compute_dtype: Any = None,
) -> list[Episode]:
    """Play `episodes` to the end together: each turn, one `generate` for every live episode.

    A turn's tool calls are run in order (a turn without one is parsed as plain text, see
    `parse_model_output`). An episode ends when its environment says done, when its record would exceed
    `max_completion_tokens` (training: like TRL, the sample stops as it is, and `Episode.truncated` says so), or after
    `max_turns` turns. With `max_context_tokens` (evals) an over-long conversation is trimmed by `prompts.fit_context`
    instead.

    A turn that reaches `max_turn_tokens` without ending is closed, in training and in eval alike: its tool calls run,
    an end-of-turn token is appended (`env_mask` 0: the model did not write it) and the episode plays on. Why: the
    turn cap bounds compute, it is not a rule of the task; the environment's step budget is. Ending the episode there
    (as training did before) gave it reward 0 and a negative advantage for something eval forgives, pushing GRPO
    toward short episodes; closing it lets the episode's own outcome judge the babbling turn (it spent a step).
    Only an episode cut by `max_completion_tokens`, a cap eval does not have, is `truncated`: its outcome is unknown,
    so `BatchedRollout` leaves it out of the loss (TRL's `mask_truncated_completions`).

    With `keep_cache` (default) each episode keeps its KV cache from turn to turn (a turn reads only the tool result,
    the prompts' shared prefix is read once) whenever the decoding allows it — greedy or plain temperature sampling on
    a model with a plain key/value cache: `kept_cache_decoder` picks the decoder (on a CUDA device the graph decoder,
    elsewhere `MultiTurnDecoder`; `SQLENV_DECODER` forces one). Otherwise, or with `keep_cache=False`, every turn
    re-reads each conversation (`generate_new_tokens`). `decoder` passes one in (kept across calls by the batched
    rollout, so its captured graphs are reused; or to read its `stats`). `compute_dtype` (`decoders.decode_dtype` of
    a run's precision): the decoder made here computes as a trainer's bf16/fp16 autocast does.
    """
    pad_id = renderer.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = renderer.tokenizer.eos_token_id
    eos = set(renderer.eos_token_ids)
    if generation_config is not None:
        plain = plain_temperature(generation_config)
        if plain is not None:
            sample, temperature = True, plain
        else:
            keep_cache = False  # top-p/k, penalties...: model.generate, re-reading
    if keep_cache and decoder is None and eos:
        decoder = kept_cache_decoder(model, pad_id, eos, compute_dtype=compute_dtype)
    if not keep_cache:
        decoder = None
    if decoder is not None:
        # A decoder kept from an earlier play (the batched rollout keeps one across GRPO steps) holds rows computed by
        # the weights of their time, keyed by episodes' `id()`s, which Python reuses: none may be read for this play.
        decoder.forget()
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
        if decoder is not None:
            new_tokens = decoder.generate({id(e): e.input_ids() for e, _ in pairs},
                                          {id(e): room for e, room in pairs}, sample=sample, temperature=temperature)
            outputs = [new_tokens[id(e)] for e, _ in pairs]
            if sample:
                for e, _ in pairs:
                    e.sampled_logprobs += decoder.last_logprobs.get(id(e), [])
        else:
            outputs = generate_new_tokens(model, [e.input_ids() for e, _ in pairs], pad_id,
                                          max(r for _, r in pairs), generation_config=generation_config,
                                          sample=sample, temperature=temperature, eos_ids=eos)
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
            if not ended:  # the turn reached max_turn_tokens: close it and play on (see the docstring)
                if max_completion_tokens is not None and len(e.completion_ids) >= max_completion_tokens:
                    # no room for the closing token: the episode's budget cut the turn; stop the sample as it is
                    e.truncated = e.truncated or not e.done
                    e.done = True
                    continue
                e.completion_ids.append(renderer.tokenizer.eos_token_id)
                e.env_mask.append(0)
                if e.context_ids is not None:
                    e.context_ids = e.context_ids + [renderer.tokenizer.eos_token_id]
            if e.done:
                continue
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

