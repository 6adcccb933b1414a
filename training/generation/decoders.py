"""Which kept-cache decoder plays a model: `kept_cache_decoder(model, pad_id, eos_ids)`.

Two decoders keep each episode's KV cache across turns, with the same interface and, greedy, the same tokens:

- `GraphDecoder` (`training.generation.graph_decoder`): fixed-shape slots, the decoding step a CUDA graph, sampling
  and end-of-turn checks on the device. The choice on a CUDA device, for the models it runs (Llama, Mistral, Qwen2,
  Qwen3 in float weights, no PEFT adapter).
- `MultiTurnDecoder` (`training.generation.multi_turn`): transformers' forward, eager. The choice on a CPU (where
  the graph decoder, eager there too, is no faster: `bench/decoding/decoder.py --decoders new,graph`) and for every
  other model with a plain KV cache.

`SQLENV_DECODER` forces one: `graph` (on any device: on a CPU the graph decoder runs eagerly), `kept`
(`MultiTurnDecoder`), or `auto` (the default: as above).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DECODER_ENV", "DECODERS", "decoder_choice", "kept_cache_decoder"]

#: The environment variable that forces a decoder.
DECODER_ENV = "SQLENV_DECODER"
DECODERS = ("auto", "graph", "kept")


def decoder_choice(kind: str | None = None) -> str:
    """`kind`, else `$SQLENV_DECODER`, else `auto`; checked."""
    kind = (kind or os.environ.get(DECODER_ENV) or "auto").strip().lower()
    if kind not in DECODERS:
        raise ValueError(f"{DECODER_ENV}={kind!r}: expected one of {', '.join(DECODERS)}")
    return kind


def kept_cache_decoder(model: Any, pad_id: int, eos_ids: set[int], *, kind: str | None = None,
                       compute_dtype: Any = None, lm_head_fp32: bool = False) -> Any:
    """The decoder that keeps `model`'s episodes' caches across turns, or None when neither can (then callers
    re-read every conversation each turn).

    Args:
        model: the causal LM, on its device.
        pad_id, eos_ids: as `MultiTurnDecoder`.
        kind: `auto` (default: `$SQLENV_DECODER`, else auto), `graph` or `kept` (see the module docstring). A forced
            `graph` falls back to `MultiTurnDecoder` for a model the graph decoder cannot run.
        compute_dtype: `torch.bfloat16` to decode an fp32 model as its trainer's bf16 autocast computes (the graph
            decoder only; `MultiTurnDecoder` decodes in the weights' dtype). Default None.
        lm_head_fp32: with `compute_dtype`, the LM head in fp32 (TRL's `cast_lm_head_to_fp32`).
    """
    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    kind = decoder_choice(kind)
    if not eos_ids:
        return None
    if kind != "kept" and GraphDecoder.supports(model):
        on_cuda = next(model.parameters()).device.type == "cuda"
        if kind == "graph" or on_cuda:
            return GraphDecoder(model, pad_id, eos_ids, compute_dtype=compute_dtype, lm_head_fp32=lm_head_fp32)
    if MultiTurnDecoder.supports(model):
        return MultiTurnDecoder(model, pad_id, eos_ids)
    return None
