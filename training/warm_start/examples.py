"""The warm start's training examples: each teacher episode as the token ids play feeds and generates.

When the model plays (`training.generation.episodes.play_batched`, GRPO's `BatchedRollout`, evals), its token record
is built segment by segment by `ChatRenderer`: the prompt ids (rendered with the generation prompt), then per turn
the ids the model generated up to and including its end of turn, then the tool results' ids
(`ChatRenderer.tool_suffix_ids`, which end with the next generation prompt). Rendering a whole conversation to text
and tokenizing it at once gives other ids: a BPE tokenizer merges across the segment boundaries. SmolLM2's, for
one, reads the generation prompt's closing `"</think>\\n\\n"` as one `"\\n\\n"` token when the prompt ends there (what
play feeds) but as `"\\n"`, `"\\n"` when `"<tool_call>"` follows (the joined text), so the model would learn its
first token of every turn after a context it never sees when it plays.

So an example is built from the same segments: `input_ids` with `assistant_masks` (1 on the tokens the model
generates, end-of-turn token included; 0 on the prompt and the tool results), a pre-tokenized dataset that TRL's
`SFTTrainer` trains on as it is (its labels are -100 wherever the mask is 0).

The mask also covers the empty `<think>` block that closes each generation prompt (`enable_thinking=False`) and the
newline after each `<|im_end|>`, as TRL's training template marks them (inside `{% generation %}`): play feeds them,
so training them changes nothing the model plays, and on a tokenizer that splits at the segment boundaries (the tiny
model's) an example is then exactly what `SFTTrainer(assistant_only_loss=True)` trained on the joined text. With
those tokens out of the loss the default run fell from 72% to 45% (docs/EXPERIMENTS.md section 12).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from training.generation.chat import ChatRenderer

__all__ = ["assistant_turn_ids", "think_tail_length", "episode_example", "build_sft_dataset"]

_DUMMY_USER = [{"role": "user", "content": "dummy"}]


def assistant_turn_ids(renderer: ChatRenderer, message: dict[str, Any]) -> list[int]:
    """The ids a model generates for the assistant `message` after the generation prompt, through its end of turn.

    The turn's text is what the template writes for the message after the generation prompt (rendered after a dummy
    user turn, as `ChatRenderer.tool_suffix_ids` renders tool results), up to the end-of-turn token; it is tokenized
    alone, as a model generates it, and the end-of-turn id appended. With `enable_thinking=False` the generation
    prompt holds the empty `<think>` block, so the turn starts at the content; otherwise the model writes the block.
    """
    tokenizer = renderer.tokenizer
    render = dict(tokenize=False, chat_template=renderer.chat_template, **renderer.chat_template_kwargs)
    head = tokenizer.apply_chat_template(_DUMMY_USER, add_generation_prompt=True, **render)
    text = tokenizer.apply_chat_template(_DUMMY_USER + [message], add_generation_prompt=False, **render)
    if not text.startswith(head):
        raise ValueError("chat template does not render an assistant turn after its generation prompt: "
                         f"{head[-40:]!r} is not a prefix of {text[len(head) - 40:len(head) + 40]!r}")
    body = text[len(head):]
    end = body.find(tokenizer.eos_token)
    if end < 0:
        raise ValueError(f"the rendered assistant turn has no end-of-turn token {tokenizer.eos_token!r}: {body!r}")
    return list(tokenizer.encode(body[:end], add_special_tokens=False)) + [tokenizer.eos_token_id]


@functools.lru_cache(maxsize=8)
def _think_tail(renderer: ChatRenderer) -> str:
    """The generation prompt's text after the role header (the empty `<think>` block a template with
    `enable_thinking=False` writes there), "" if none: rendered once per renderer, not per segment."""
    tokenizer = renderer.tokenizer
    render = dict(tokenize=False, chat_template=renderer.chat_template)
    kwargs = renderer.chat_template_kwargs
    if kwargs.get("enable_thinking", True):
        return ""
    closed = tokenizer.apply_chat_template(_DUMMY_USER, add_generation_prompt=True, **render, **kwargs)
    header = tokenizer.apply_chat_template(_DUMMY_USER, add_generation_prompt=True, **render,
                                           **{**kwargs, "enable_thinking": True})
    if not closed.startswith(header):
        return ""
    return closed[len(header):]


def think_tail_length(renderer: ChatRenderer, ids: list[int]) -> int:
    """How many of the last `ids` (a segment ending with the generation prompt) are the generation prompt's tail
    after the role header: the empty `<think>` block a template with `enable_thinking=False` writes there (0 if none).
    """
    tail = _think_tail(renderer)
    if not tail:
        return 0
    for k in range(1, min(len(ids), 16) + 1):
        decoded = renderer.tokenizer.decode(ids[-k:])
        if decoded == tail:
            return k
        if len(decoded) > len(tail):
            break
    return 0


def episode_example(renderer: ChatRenderer, messages: list[dict[str, Any]]) -> dict[str, list[int]]:
    """`{"input_ids", "assistant_masks"}` of one conversation, segment by segment as play builds it.

    The messages before the first assistant turn are the prompt (`ChatRenderer.prompt_ids`, mask 0); each assistant
    turn is `assistant_turn_ids` (mask 1, or 0 for a turn marked `"trained": False`: a teacher's deliberate mistake,
    seen as context but not imitated); the tool messages after a turn are `ChatRenderer.tool_suffix_ids` (mask 0).
    Where TRL's training template marks fed tokens as generated, so does the mask: the empty `<think>` block ending
    the prompt and each tool suffix (`think_tail_length`), and the newline after each turn's `<|im_end|>`.
    The conversation must alternate assistant turns and (one or more) tool results, and end on an assistant turn.
    """
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None or messages[-1]["role"] != "assistant":
        raise ValueError("a warm-start conversation has a prompt, then assistant turns, and ends on an assistant turn")
    ids = renderer.prompt_ids(messages[:first])
    mask = _segment_mask(renderer, ids)
    i = first
    while i < len(messages):
        message = messages[i]
        if message["role"] != "assistant":
            raise ValueError(f"message {i}: expected an assistant turn, got {message['role']!r}")
        turn = assistant_turn_ids(renderer, {k: v for k, v in message.items() if k != "trained"})
        ids += turn
        mask += [int(message.get("trained", True))] * len(turn)  # a teacher's deliberate mistake is not imitated
        i += 1
        tools = []
        while i < len(messages) and messages[i]["role"] == "tool":
            tools.append(messages[i])
            i += 1
        if tools:
            suffix = renderer.tool_suffix_ids(tools)
            ids += suffix
            mask += _segment_mask(renderer, suffix, after_turn=True)
    # The newline the template closes the last turn's `<|im_end|>` line with, trained as the other turns' are.
    closing_line = renderer.tokenizer.encode("\n", add_special_tokens=False)
    ids += closing_line
    mask += [1] * len(closing_line)
    return {"input_ids": ids, "assistant_masks": mask}


def _segment_mask(renderer: ChatRenderer, ids: list[int], after_turn: bool = False) -> list[int]:
    """A fed segment's mask: 0, but 1 where TRL's training template marks it generated: the empty think block at its
    end and, after a turn, the newline that closes the turn's `<|im_end|>` line."""
    mask = [0] * len(ids)
    tail = think_tail_length(renderer, ids)
    if tail:
        mask[-tail:] = [1] * tail
    if after_turn and ids and renderer.tokenizer.decode(ids[:1]) == "\n":
        mask[0] = 1
    return mask


def build_sft_dataset(conversations: list[dict[str, Any]], renderer: ChatRenderer):
    """A pre-tokenized `datasets.Dataset` (`input_ids`, `assistant_masks`) of the teacher's `conversations`, rendered
    by `renderer`: the one play uses, for the same prompt (`renderer.prompt` must render tool schemas exactly when the
    conversations carry them) and the same template variables (`enable_thinking`)."""
    from datasets import Dataset

    from sqlenv.agent.prompts import renders_tool_schemas

    for conversation in conversations:
        has_tools = json.loads(conversation.get("tools") or "null") is not None
        if has_tools != renders_tool_schemas(renderer.prompt):
            raise ValueError(f"the conversations were played {'with' if has_tools else 'without'} tool schemas, the "
                             f"renderer renders prompt={renderer.prompt!r}: build both for the same prompt")
    return Dataset.from_list([episode_example(renderer, c["messages"]) for c in conversations])
