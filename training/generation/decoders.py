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

Mixed precision (`compute_dtype`, from a run's precision by `decode_dtype`): a bf16 run's trainer computes its loss
under bf16 autocast over fp32 weights, and its decoders compute the same way, so that the episodes are sampled from
the distribution the loss scores and greedy evals play the model the run trains. The graph decoder does it without
casting a weight per step (bf16 copies of the linear layers, made once per play), so it is the choice on any device
then, a CPU included (where its bf16 products run on the CPU's matrix units); `MultiTurnDecoder` does it under
`torch.autocast` for a model the graph decoder cannot run (a PEFT adapter).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["DECODER_ENV", "DECODERS", "decode_dtype", "decoder_choice", "kept_cache_decoder"]

#: The environment variable that forces a decoder.
DECODER_ENV = "SQLENV_DECODER"
DECODERS = ("auto", "graph", "kept")


def decoder_choice(kind: str | None = None) -> str:
    """`kind`, else `$SQLENV_DECODER`, else `auto`; checked."""
    kind = (kind or os.environ.get(DECODER_ENV) or "auto").strip().lower()
    if kind not in DECODERS:
        raise ValueError(f"{DECODER_ENV}={kind!r}: expected one of {', '.join(DECODERS)}")
    return kind


def decode_dtype(precision: str | None, model: Any) -> Any:
    """The dtype a decoder computes in to play `model` as its trainer does at `precision` (a run's resolved
    precision: "bf16", "fp16", "fp32" or None): `torch.bfloat16` / `torch.float16` over fp32 weights (the trainer's
    autocast), None otherwise (the weights' own dtype: fp32, or weights loaded in bf16)."""
    if precision not in ("bf16", "fp16"):
        return None
    import torch

    if next(model.parameters()).dtype != torch.float32:
        return None
    return torch.bfloat16 if precision == "bf16" else torch.float16


def kept_cache_decoder(model: Any, pad_id: int, eos_ids: set[int], *, kind: str | None = None,
                       compute_dtype: Any = None, lm_head_fp32: bool = False) -> Any:
    """The decoder that keeps `model`'s episodes' caches across turns, or None when neither can (then callers
    re-read every conversation each turn).

    Args:
        model: the causal LM, on its device.
        pad_id, eos_ids: as `MultiTurnDecoder`.
        kind: `auto` (default: `$SQLENV_DECODER`, else auto), `graph` or `kept` (see the module docstring). A forced
            `graph` falls back to `MultiTurnDecoder` for a model the graph decoder cannot run.
        compute_dtype: `torch.bfloat16` to decode an fp32 model as its trainer's bf16 autocast computes
            (`decode_dtype`): the graph decoder on any device, eager off CUDA; `MultiTurnDecoder` under autocast
            for a model the graph decoder cannot run. Default None: the weights' dtype.
        lm_head_fp32: with `compute_dtype`, the LM head in fp32 (TRL's `cast_lm_head_to_fp32`).
    """
    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    kind = decoder_choice(kind)
    if not eos_ids:
        return None
    if kind != "kept" and GraphDecoder.supports(model):
        on_cuda = next(model.parameters()).device.type == "cuda"
        if kind == "graph" or on_cuda or compute_dtype is not None:
            return GraphDecoder(model, pad_id, eos_ids, compute_dtype=compute_dtype, lm_head_fp32=lm_head_fp32)
    if MultiTurnDecoder.supports(model):
        return MultiTurnDecoder(model, pad_id, eos_ids, autocast_dtype=compute_dtype)
    return None
