"""The decoder that keeps each episode's KV cache across turns (`training/generation/multi_turn.py`), on the real
tiny model: greedy equivalence with the re-reading decoder, cache reuse across turns, the shared prefix, rows that
end early or are dropped, a context that no longer extends the cache, sampling."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _decoder(tiny, **kwargs):
    from training.generation.multi_turn import MultiTurnDecoder

    model, tokenizer = tiny
    model.eval()
    return MultiTurnDecoder(model, pad_id=tokenizer.pad_token_id or 0, eos_ids={tokenizer.eos_token_id}, **kwargs)


def _rereading(tiny, sequences: list[list[int]], max_new_tokens: int, **kwargs) -> list[list[int]]:
    from training.generation.decoding import decode_pruned

    model, tokenizer = tiny
    model.eval()
    return decode_pruned(model, sequences, tokenizer.pad_token_id or 0, max_new_tokens, {tokenizer.eos_token_id},
                         kwargs.get("sample", False), kwargs.get("temperature", 1.0))


def _prompts(tiny, n: int) -> list[list[int]]:
    """The first prompts of `n` built-in eval episodes, rendered as training renders them."""
    from sqlenv.environment import SQLEnvironment
    from sqlenv.agent.prompts import initial_messages
    from training.generation.chat import ChatRenderer

    renderer = ChatRenderer(tiny[1], chat_template_kwargs={"enable_thinking": False})
    env = SQLEnvironment.from_dataset("builtin", split="eval", step_budget=3)
    try:
        return [renderer.prompt_ids(initial_messages(env.reset(seed=i))) for i in range(n)]
    finally:
        env.close()


def _play(tiny, keep_cache: bool, n: int = 6, step_budget: int = 4, turn_tokens: int = 24):
    from sqlenv.environment import SQLEnvironment
    from training.generation.model_policy import play_model_episodes

    model, tokenizer = tiny
    envs = [SQLEnvironment.from_dataset("builtin", split="eval", step_budget=step_budget) for _ in range(n)]
    try:
        observations = [env.reset(seed=i) for i, env in enumerate(envs)]
        return play_model_episodes(model, tokenizer, envs, observations, max_turn_tokens=turn_tokens,
                                   keep_cache=keep_cache)
    finally:
        for env in envs:
            env.close()


def test_greedy_episodes_are_token_for_token_those_of_the_rereading_decoder(tiny):
    old = _play(tiny, keep_cache=False)
    new = _play(tiny, keep_cache=True)
    assert [e.completion_ids for e in new] == [e.completion_ids for e in old]
    assert [e.messages for e in new] == [e.messages for e in old]
    assert all(e.turns >= 2 for e in new)  # several turns each: the kept cache was used


def test_a_turn_reads_only_what_is_new_and_decodes_as_a_fresh_read(tiny):
    prompt = _prompts(tiny, 1)[0]
    decoder = _decoder(tiny)
    first = decoder.generate({"a": prompt}, 12)["a"]
    assert decoder.cached_ids("a") == prompt + first[:-1]  # the last token is read with the next turn
    tool_result = _prompts(tiny, 2)[1][-9:]  # any tokens standing in for a tool result
    conversation = prompt + first + tool_result
    fed_before = decoder.stats.fed
    second = decoder.generate({"a": conversation}, 12)["a"]
    prefill = 1 + len(tool_result)  # the last generated token and the tool result, nothing older
    assert decoder.stats.fed - fed_before == prefill + len(second) - 1
    assert second == _rereading(tiny, [conversation], 12)[0]


def test_rows_starting_together_read_their_shared_prefix_once(tiny):
    prompts = _prompts(tiny, 3)
    shared = 0
    while all(p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    assert shared >= 16  # the system prompt and tool schemas
    decoder = _decoder(tiny)
    out = decoder.generate(dict(enumerate(prompts)), 8)
    generated = sum(len(t) for t in out.values())
    steps = max(len(t) for t in out.values())  # decoding forward calls after the prefill
    assert decoder.stats.forward_calls == 2 + steps - 1  # the prefix alone, the rest batched, then decoding
    rest = sum(len(p) - shared for p in prompts)
    assert decoder.stats.fed == shared + rest + generated - len(prompts)
    unshared = _decoder(tiny, min_shared_prefix=10**9)
    assert unshared.generate(dict(enumerate(prompts)), 8) == out
    assert unshared.stats.fed == sum(len(p) for p in prompts) + generated - len(prompts)


def test_shared_prefixes_finds_the_common_prefix_and_each_group_s_longer_one():
    from training.generation.multi_turn import shared_prefixes

    system = list(range(100, 120))
    a, b = system + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], system + [21, 22, 23, 24, 25, 26, 27, 28, 29]
    rows = {("a", 0): a, ("b", 0): b, ("a", 1): a, ("b", 1): b, ("a", 2): a + [7], ("c", 0): system + [5]}
    plan = shared_prefixes(list(rows), rows, min_shared=4)
    assert plan.common == 20  # the system prompt (("c", 0) adds one token of its own)
    # each group's prompt but its last token, which each row reads itself: its logits choose its first token
    assert plan.groups == [([("a", 0), ("a", 1), ("a", 2)], len(a) - 1), ([("b", 0), ("b", 1)], len(b) - 1)]
    assert shared_prefixes(list(rows), rows, min_shared=10) == type(plan)(20, [])  # 9 and 8 more: below 10
    assert shared_prefixes([("a", 0)], rows, min_shared=1).groups == []  # one row shares with nobody
    two = {0: [1, 2, 3, 4], 1: [9, 2, 3, 4, 5]}  # nothing in common
    assert shared_prefixes([0, 1], two, min_shared=1) == type(plan)(0, [])


def test_each_group_of_rows_with_one_prompt_reads_it_once(tiny):
    """GRPO's rows: G episodes of each question start from one prompt. The system prompt is read once for all, each
    question's rest once for its group; every row decodes as it would alone."""
    prompts = _prompts(tiny, 3)
    shared = 0
    while all(p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    rows = {(q, g): prompts[q] for q in range(3) for g in range(3)}
    decoder = _decoder(tiny)
    out = decoder.generate(rows, 8)
    unshared = _decoder(tiny, min_shared_prefix=10**9)
    assert unshared.generate(rows, 8) == out
    assert all(out[(q, g)] == out[(q, 0)] for q, g in rows)  # greedy: one prompt, one answer
    generated = sum(len(t) for t in out.values())
    # the common prefix once, each question's rest but its last token once, each row's last token itself
    read = shared + sum(len(p) - 1 - shared for p in prompts) + len(rows)
    assert decoder.stats.fed == read + generated - len(rows)
    assert unshared.stats.fed == sum(len(p) for p in rows.values()) + generated - len(rows)
    assert decoder.stats.fed < unshared.stats.fed / 2


def test_rows_that_end_early_leave_the_batch_and_the_others_decode_as_alone(tiny):
    prompts = _prompts(tiny, 3)
    decoder = _decoder(tiny)
    out = decoder.generate(dict(enumerate(prompts)), {0: 2, 1: 10, 2: 5})
    assert [len(out[i]) for i in range(3)] == [2, 10, 5]
    for i, budget in ((0, 2), (1, 10), (2, 5)):
        assert out[i] == _rereading(tiny, [prompts[i]], budget)[0]
        assert decoder.cached_ids(i) == prompts[i] + out[i][:-1]
    # a row not asked for again has ended its episode: its cache is forgotten
    decoder.generate({1: prompts[1] + out[1]}, 3)
    assert decoder.cached_ids(0) is None and decoder.cached_ids(2) is None and decoder.cached_ids(1) is not None


def test_a_context_that_no_longer_extends_the_cache_keeps_the_common_prefix(tiny):
    prompts = _prompts(tiny, 2)
    decoder = _decoder(tiny)
    first = decoder.generate({"a": prompts[0]}, 6)["a"]
    trimmed = prompts[0][:-5] + prompts[1][-7:]  # as a trimmed context: the start kept, the rest rewritten
    fed_before = decoder.stats.fed
    out = decoder.generate({"a": trimmed}, 6)["a"]
    assert out == _rereading(tiny, [trimmed], 6)[0]
    assert decoder.stats.fed - fed_before == 7 + len(out) - 1
    assert first  # the first turn did generate


def test_sampling_draws_as_the_rereading_decoder_does(tiny):
    import torch

    prompt = _prompts(tiny, 1)[0]
    torch.manual_seed(7)
    old = _rereading(tiny, [prompt], 20, sample=True, temperature=1.3)[0]
    decoder = _decoder(tiny)
    torch.manual_seed(7)
    new = decoder.generate({0: prompt}, 20, sample=True, temperature=1.3)[0]
    assert new == old  # one row: the same probabilities, the same random draws


def test_a_model_with_a_sliding_window_cache_is_not_supported(tiny):
    import copy

    from training.generation.multi_turn import MultiTurnDecoder

    model = tiny[0]
    assert MultiTurnDecoder.supports(model)
    windowed = copy.deepcopy(model.config)
    windowed.use_sliding_window, windowed.sliding_window = True, 8
    windowed.layer_types = ["sliding_attention"] * windowed.num_hidden_layers
    holder = type("Holder", (), {"config": windowed})()
    assert not MultiTurnDecoder.supports(holder)


def test_model_policy_keeps_its_episode_cache_across_turns(tiny):
    from sqlenv.environment import SQLEnvironment
    from sqlenv.evaluation.evaluate import evaluate
    from training.generation.model_policy import ModelPolicy

    model, tokenizer = tiny
    policy = ModelPolicy(model, tokenizer, max_turn_tokens=8)
    env = SQLEnvironment.from_dataset("builtin", split="eval", step_budget=3)
    try:
        steps = evaluate(env, policy, n_episodes=1, seed=1).episodes[0]["steps"]
    finally:
        env.close()
    stats = policy.decoder.stats
    assert len(steps) == 3 and stats.generated > 8  # several turns
    # every token of the conversation was read once (re-reading would read the prompt at every turn)
    assert stats.fed == len(policy.decoder.cached_ids(0))


def test_reserved_layer_holds_what_a_dynamic_layer_holds_and_grows_when_full():
    import torch
    from transformers.cache_utils import DynamicLayer

    from training.generation.reserved_cache import ReservedLayer

    start_k, start_v = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
    room_k, room_v = torch.zeros(3, 2, 6, 5), torch.zeros(3, 2, 6, 5)
    room_k[:, :, :4], room_v[:, :, :4] = start_k, start_v
    reserved, dynamic = ReservedLayer(room_k, room_v, 4), DynamicLayer()
    dynamic.update(start_k, start_v)
    for n in (1, 1, 3):  # the third write outgrows the room
        k, v = torch.randn(3, 2, n, 5), torch.randn(3, 2, n, 5)
        got, want = reserved.update(k, v), dynamic.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert reserved.get_seq_length() == dynamic.get_seq_length() == 9
    keep = torch.tensor([0, 2])
    reserved.batch_select_indices(keep)
    dynamic.batch_select_indices(keep)
    assert torch.equal(reserved.keys, dynamic.keys)
    reserved.crop(-2)
    dynamic.crop(-2)
    assert torch.equal(reserved.values, dynamic.values) and reserved.get_seq_length() == 7
