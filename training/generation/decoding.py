"""Batched decoding for the paths that play episodes themselves (the batched rollout, evals, traces).

`generate_new_tokens` runs one generation over left-padded sequences and returns each row's new tokens. For greedy
decoding or plain temperature sampling (TRL's default settings) it uses `decode_pruned`, a KV-cache loop that drops
each row as soon as it ends, so short turns stop costing compute while long ones finish — what makes batching many
episodes pay; anything else (top-p/k, penalties, biases...) goes through `model.generate`.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["generate_new_tokens", "decode_pruned", "plain_temperature"]


def plain_temperature(generation_config: Any) -> float | None:
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


def _left_padded(sequences: list[list[int]], pad_id: int, device: Any):
    """(input_ids, attention_mask) of `sequences` padded on the left to the longest, on `device`."""
    import torch

    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        input_ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        attention[i, width - len(seq):] = 1
    return input_ids.to(device), attention.to(device)


def decode_pruned(model: Any, sequences: list[list[int]], pad_id: int, max_new_tokens: int,
                   eos_ids: set[int], sample: bool, temperature: float) -> list[list[int]]:
    """Batched decoding with a KV cache that drops each row as soon as it ends (EOS), so short turns stop
    costing compute while long ones finish — what makes batching many episodes pay. Greedy or plain
    temperature sampling. Returns each row's new tokens, up to and including its EOS."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    n = len(sequences)
    input_ids, attention = _left_padded(sequences, pad_id, device)
    eos = torch.tensor(sorted(eos_ids), device=device)
    results: list[list[int]] = [[] for _ in range(n)]
    rows = torch.arange(n, device=device)
    cache = DynamicCache()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention, cache=cache, use_cache=True,
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
            logits = model(input_ids=token[:, None], attention_mask=attention, cache=cache,
                           use_cache=True).logits[:, -1, :]
    return results


def generate_new_tokens(model: Any, sequences: list[list[int]], pad_id: int, max_new_tokens: int,
                        generation_config: Any = None, sample: bool = True, temperature: float = 1.0,
                        eos_ids: set[int] | None = None) -> list[list[int]]:
    """One batched generation over left-padded `sequences`; returns the new tokens of each.

    Uses the lean decoder for greedy or plain temperature sampling (TRL's default settings), and
    `model.generate` with `generation_config` for anything else.
    """
    import torch

    if eos_ids:
        if generation_config is None:
            return decode_pruned(model, sequences, pad_id, max_new_tokens, eos_ids, sample, temperature)
        plain = plain_temperature(generation_config)
        if plain is not None:
            return decode_pruned(model, sequences, pad_id, max_new_tokens, eos_ids, True, plain)

    input_ids, attention = _left_padded(sequences, pad_id, next(model.parameters()).device)
    width = input_ids.shape[1]
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
        out = model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
    return out[:, width:].tolist()

