"""Item 2 of `bench/gpu/gpu_check.py`: the decoders side by side, on one machine, one model shape, one workload.

- **kept**: today's kept-cache decoder (`MultiTurnDecoder`, transformers' forward, eager);
- **graph**: the graph decoder (`GraphDecoder`: fixed-shape slots, each decoding step a replayed CUDA graph);
- **cb**: transformers' continuous batching (`model.generate_batch`, paged cache, its own CUDA graphs), each turn
  resubmitted whole with one persistent manager, so its prefix sharing can serve the second turn; measured at the
  rows asked for it only (the check: 64), being the slowest by far.

The workload (`two_turns`): every row generates `tokens` tokens greedily (end of turn disabled, so every row decodes
exactly that many), then a second turn resubmits each row's conversation with 8 tokens standing in for a tool
result and generates `tokens` more. Generated tokens/s count both turns, their prefills included; each decoder runs
it once untimed first at the same rows (graph captures, CB's warm-up; today's decoder: a short warm-up per precision),
then timed. Precisions: `fp32`
(fp32 weights), `bf16` (bf16 weights), and for the graph decoder `fp32+bf16` (fp32 weights decoded as a trainer's
bf16 autocast computes: what a bf16 run's rollouts use). Exactness: each decoder's greedy tokens against
`MultiTurnDecoder`'s at the same rows and precision (rows identical / rows).

A model of SmolLM2-135M's exact shape with random weights (`shape_model`) serves the device's first call, which
carries no weights; the decoding rate depends on the shape, not the values.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["DECODERS", "ContinuousBatching", "shape_model", "make_decoder", "two_turns", "compare", "best", "rate"]

DECODERS = ("kept", "graph", "cb")
#: A token id no model emits: with it as the only end-of-turn token, rows decode exactly the tokens asked for.
NEVER = -1
TOOL_TOKENS = 8


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def shape_model(config: dict, device: str, seed: int = 0):
    """A causal LM built from `config` (a transformers config as a dict, `model_type` included) with random weights
    (seeded), in fp32 on `device`, in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    kind = fields.pop("model_type")
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **fields), dtype=torch.float32)
    return model.eval()


def _tool(row: int) -> list[int]:
    return [(7 * row + 11 * i) % 97 + 1 for i in range(TOOL_TOKENS)]


class ContinuousBatching:
    """transformers' continuous batching behind the kept-cache decoders' `generate`: each call submits every row's
    whole sequence to one persistent manager (`generate_batch(..., persistent_manager=True)`), whose paged cache
    shares blocks of prefixes it has seen; `close()` ends it. Its cache holds `rows` sequences of `length` tokens
    twice over (left to itself it sizes the cache to the free memory: ~20 s to allocate on a CPU, tens of GiB)."""

    def __init__(self, model: Any, pad_id: int, rows: int, length: int):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.model = model
        self.config = GenerationConfig(do_sample=False, eos_token_id=NEVER, pad_token_id=pad_id)
        page = ContinuousBatchingConfig().page_size
        self.batching = ContinuousBatchingConfig(num_blocks=2 * rows * -(-length // page) + 16)

    def generate(self, sequences: dict, max_new_tokens: int) -> dict:
        keys = list(sequences)
        out = self.model.generate_batch([sequences[k] for k in keys], generation_config=self.config,
                                        continuous_batching_config=self.batching, max_new_tokens=max_new_tokens,
                                        persistent_manager=True)
        results = list(out.values())  # in the inputs' order
        failed = [r.error for r in results if r.error is not None]
        if len(results) != len(keys) or failed:
            raise RuntimeError(f"generate_batch returned {len(results)} of {len(keys)} rows; errors: {failed[:2]}")
        return {k: list(r.generated_tokens) for k, r in zip(keys, results)}

    def forget(self) -> None:
        pass

    def close(self) -> None:
        self.model.destroy_cached_continuous_batching_manager()


def make_decoder(kind: str, model: Any, *, compute_dtype: Any = None, pad_id: int = 0, rows: int = 1,
                 length: int = 1) -> Any:
    """The decoder `kind` (`DECODERS`) over `model`, end of turn disabled, for `rows` sequences of at most `length`
    tokens (continuous batching sizes its cache to them)."""
    from training.generation.graph_decoder import GraphDecoder
    from training.generation.multi_turn import MultiTurnDecoder

    if kind == "cb":
        return ContinuousBatching(model, pad_id, rows, length)
    if kind == "graph":
        return GraphDecoder(model, pad_id, {NEVER}, compute_dtype=compute_dtype)
    return MultiTurnDecoder(model, pad_id, {NEVER})


def two_turns(decoder: Any, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], float]:
    """The workload on `decoder` from nothing kept: each row's tokens of both turns, and the seconds it took."""
    decoder.forget()
    _sync()
    start = time.perf_counter()
    first = decoder.generate(dict(enumerate(prompts)), tokens)
    second = decoder.generate({i: p + first[i] + _tool(i) for i, p in enumerate(prompts)}, tokens)
    _sync()
    return [first[i] + second[i] for i in range(len(prompts))], time.perf_counter() - start


def _precisions(model: Any):
    """(label, model, compute dtype) of each precision measured; the bf16 copy is made once."""
    import copy

    import torch

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    return [("fp32", model, None), ("bf16", bf16, None), ("fp32+bf16", model, torch.bfloat16)]


def compare(model: Any, prompts: list[list[int]], rows: tuple[int, ...], tokens: int, *,
            kinds: tuple[str, ...] = DECODERS, budget_s: float = 120.0, pad_id: int = 0,
            cb_rows: tuple[int, ...] | None = None, update: Callable[..., None] = lambda **k: None,
            log: Callable[[str], None] = print) -> dict:
    """Every decoder x precision x rows of the workload, within `budget_s` seconds (what does not fit is listed as
    skipped): the project's decoders first, then continuous batching (whose warm-up is the longest) at `cb_rows` only
    (None: every row count; at 256 rows it took 160 s of a lent H200's call 1 for 290 tokens/s, 50x slower than the
    graph decoder); each at 64 rows first, then the most rows, then the fewest; `fp32+bf16` is the graph decoder's
    only. `update(rates=...)` after each measurement. Returns the rates, and per precision and rows the fastest
    decoder whose greedy tokens are `MultiTurnDecoder`'s.

    Each measurement is preceded by an untimed run of the same decoder at the same rows (today's decoder: one short
    run per precision) on prompts whose first token differs, so that continuous batching's prefix cache cannot
    serve the timed run from the warm-up while its kernels and graphs are ready, as the graph decoder's captures."""
    started = time.perf_counter()
    results: list[dict] = []
    reference: dict[tuple[str, int], list[list[int]]] = {}
    warmed: set[tuple[str, str]] = set()
    precisions = {label: (variant, compute) for label, variant, compute in _precisions(model)}
    passes = [[k for k in kinds if k != "cb"], [k for k in kinds if k == "cb"]]
    order = [(n, precision, kind) for group in passes for n in sorted(rows, key=lambda r: (r != 64, -r))
             for precision in precisions for kind in group if (precision != "fp32+bf16" or kind == "graph")
             and (kind != "cb" or cb_rows is None or n in cb_rows)]
    for n, precision, kind in order:
        variant, compute = precisions[precision]
        entry = {"decoder": kind, "precision": precision, "rows": n}
        if time.perf_counter() - started > budget_s:
            entry["skipped"] = "out of time"
            results.append(entry)
            continue
        decoder = None
        try:
            length = max(len(p) for p in prompts[:n]) + 2 * tokens + TOOL_TOKENS
            decoder = make_decoder(kind, variant, compute_dtype=compute, pad_id=pad_id, rows=n, length=length)
            if kind != "kept" or (kind, precision) not in warmed:
                warm = [[(p[0] + 1) % 97] + p[1:] for p in prompts[:n]]
                two_turns(decoder, warm, tokens if kind != "kept" else 2)
                warmed.add((kind, precision))
            out, seconds = two_turns(decoder, prompts[:n], tokens)
            generated = sum(len(o) for o in out)
            entry.update(generated=generated, seconds=round(seconds, 3),
                         tokens_per_s=round(generated / max(seconds, 1e-9), 1),
                         seconds_per_step=round(seconds / (2 * tokens), 5))
            if kind == "graph":
                entry.update(graphs_captured=decoder.graphs.captured, graph_error=decoder.graphs.error,
                             slot_gib=round(decoder.memory_bytes() / 2**30, 2))
            base = precision.split("+")[0]
            if kind == "kept":
                reference[(base, n)] = out
            if (base, n) in reference:
                same = sum(a == b for a, b in zip(out, reference[(base, n)]))
                entry["greedy_identical_rows"] = f"{same}/{n}"
                entry["greedy_identical"] = same == n
        except Exception as exc:  # noqa: BLE001 - out of memory at 256 rows, an API mismatch: the rest counts
            entry["error"] = f"{type(exc).__name__}: {exc}"[:400]
        finally:
            if decoder is not None:
                getattr(decoder, "close", getattr(decoder, "release", lambda: None))()
            del decoder
            _release()
        results.append(entry)
        update(rates=results)
        log(f"decoders: {entry}")
    return {"rates": results, "best": best(results), "tokens_per_turn": tokens}


def best(results: list[dict]) -> dict:
    """Per precision and rows: the fastest decoder among those whose greedy tokens are exact (fp32 and bf16
    weights; `MultiTurnDecoder` is exact by definition)."""
    out: dict[str, dict] = {}
    for r in results:
        if "tokens_per_s" not in r or r["precision"] == "fp32+bf16":
            continue
        exact = r["decoder"] == "kept" or r.get("greedy_identical")
        if not exact:
            continue
        key = f"{r['precision']}@{r['rows']}"
        if key not in out or r["tokens_per_s"] > out[key]["tokens_per_s"]:
            out[key] = {"decoder": r["decoder"], "tokens_per_s": r["tokens_per_s"]}
    return out


def rate(results: list[dict], decoder: str, precision: str, rows: int) -> float | None:
    """tokens/s of one measurement, None when it did not run."""
    for r in results:
        if (r["decoder"], r["precision"], r["rows"]) == (decoder, precision, rows):
            return r.get("tokens_per_s")
    return None


def _release() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
