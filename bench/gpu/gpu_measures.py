"""The measurements `bench/gpu/gpu_check.py` takes, each a function of a model or a trainer it is handed.

- `SamplingTap`: what the decoder sampled in a real rollout, with the log-probability of each drawn token under the
  distribution it was drawn from (as the decoder recorded it), row by row.
- `trainer_logprobs` / `logprob_gap`: the same tokens' log-probabilities from the trainer's own forward (its model,
  its autocast, TRL's fused LM head at the run's temperature) and the gap between the two.
- `memory_probe`: forward and backward of full-length rows through the trainer's model, per micro-batch size.
- `step_seconds`: a decoding step's seconds at N rows, from the rates item 2 measured (what `gpu_learning` plans
  evals with).
- `CaptureFailures` / `settle_device`: between items, the CUDA-graph captures that failed in an item (whatever
  decoder made them) and what an item left broken on the device, repaired, so that one item's failure does not
  fail the next one's.

None of them imports anything at module level beyond the standard library, so the check can report a missing
package as a finding rather than die on import.
"""

from __future__ import annotations

import copy
import gc
import logging
import math
import time
from collections import defaultdict
from typing import Any, Hashable

__all__ = ["sync", "peak_gib", "reset_peak", "CaptureFailures", "settle_device", "SamplingTap", "TapError",
           "trainer_logprobs", "decoder_logprobs", "logprob_gap", "memory_probe", "step_seconds", "TimedRollout",
           "step_timer"]


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


# ------------------------------------------------------------------------------------------- between items
class CaptureFailures(logging.Handler):
    """While entered, each CUDA-graph capture that failed (`training.generation.step_graphs` warns of each; its steps
    then run eagerly), whatever decoder made it: a trainer's or a run's decoders are out of an item's reach. `count`
    counts them all; `errors` holds the first 20, each with the graph's key (the graph decoder's: `batch`, `window`,
    `sampled`) and the error."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.errors: list[dict] = []
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.errors) < 20:
            key = getattr(record, "graph_key", None)
            fields = key._asdict() if hasattr(key, "_asdict") else {"key": None if key is None else repr(key)}
            self.errors.append({**fields, "error": record.getMessage()[:600]})

    def __enter__(self) -> "CaptureFailures":
        from training.generation import step_graphs

        step_graphs.logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        from training.generation import step_graphs

        step_graphs.logger.removeHandler(self)


def settle_device() -> list[str]:
    """Garbage collected and the allocator's cache emptied; on CUDA, what an item left broken, repaired, each in a
    sentence (none: an empty list):

    - a side stream left current (`torch.cuda.graph` leaves its capture stream current when ending a capture
      fails): the default stream current again;
    - PyTorch's default CUDA generator left marked as capturing (a capture that fails between its start and its end
      leaves it so; every random draw then fails with "Offset increment outside graph capture encountered
      unexpectedly"): a fresh generator state with its seed and offset. Probed with one draw whose numbers are given
      back (`fork_rng`), so a healthy generator's numbers are unchanged.
    """
    import torch

    gc.collect()
    if not torch.cuda.is_available():
        return []
    repaired = []
    try:
        if torch.cuda.current_stream() != torch.cuda.default_stream():
            torch.cuda.set_stream(torch.cuda.default_stream())
            repaired.append("a side stream was left current: the default stream is again")
        device = torch.cuda.current_device()
        try:
            with torch.random.fork_rng(devices=[device]):
                torch.empty(1, device="cuda").exponential_()
        except RuntimeError as exc:
            generator = torch.cuda.default_generators[device]
            fresh = torch.Generator(device="cuda")
            fresh.set_state(generator.get_state())
            generator.graphsafe_set_state(fresh)
            repaired.append(f"the CUDA generator could not draw ({_first_line(exc)}): it has a fresh state with its "
                            "seed and offset")
        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - a dead device is the next item's finding, not the check's end
        repaired.append(f"the device could not be settled: {_first_line(exc)}")
    return repaired


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


# ------------------------------------------------------------------------------------------- decoding rates
def step_seconds(rates: list[dict], rows: int) -> float | None:
    """Seconds per decoding step at `rows` rows, interpolated (linearly in rows) from one decoder's measurements at
    one precision (`gpu_decoders.compare`'s rates); beyond the measured rows, the last segment's slope."""
    points = sorted({r["rows"]: r["seconds_per_step"] for r in rates if r.get("seconds_per_step")}.items())
    if not points:
        return None
    if rows <= points[0][0] or len(points) == 1:
        return points[0][1]
    for (r0, s0), (r1, s1) in zip(points, points[1:]):
        if rows <= r1:
            return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
    (r0, s0), (r1, s1) = points[-2], points[-1]
    return s1 + max(0.0, (s1 - s0) / (r1 - r0)) * (rows - r1)


# ------------------------------------------------------------------------------------------- log-prob gap
class TapError(RuntimeError):
    """What the tap recorded does not line up with what the decoder returned."""


class SamplingTap:
    """Records what the kept-cache decoders sample while it is entered (a measurement tap, not a code path).

    It wraps `generate` of both kept-cache decoders (`MultiTurnDecoder`, `GraphDecoder`), keeping each call's rows in
    order, how long each row's sequence was, what they returned and the log-probability the decoder recorded for each
    drawn token (`last_logprobs`: under the distribution it drew from). `per_row()` then gives, for each row, its drawn
    tokens with their positions in the row's sequence and their log-probabilities; `decoders` the decoders that
    played, in the order they first did.
    """

    def __init__(self):
        self.calls: list[tuple[dict, dict, dict]] = []
        self.decoders: list[Any] = []

    def __enter__(self) -> "SamplingTap":
        from training.generation.graph_decoder import GraphDecoder
        from training.generation.multi_turn import MultiTurnDecoder

        self._originals = {cls: cls.generate for cls in (MultiTurnDecoder, GraphDecoder)}
        tap = self

        def wrap(original):
            def generate(decoder, sequences, max_new_tokens, **kwargs):
                results = original(decoder, sequences, max_new_tokens, **kwargs)
                lengths = {key: len(ids) for key, ids in sequences.items()}
                tap.calls.append((lengths, results, dict(decoder.last_logprobs)))
                if not any(d is decoder for d in tap.decoders):
                    tap.decoders.append(decoder)
                return results

            return generate

        for cls, original in self._originals.items():
            cls.generate = wrap(original)
        return self

    def __exit__(self, *exc: Any) -> None:
        for cls, original in self._originals.items():
            cls.generate = original

    def first_keys(self) -> list[Hashable]:
        """The rows of the first `generate` call, in order (a rollout's first turn: every episode, in order)."""
        if not self.calls:
            raise TapError("the decoder was never called: the rollout did not use a kept-cache decoder")
        lengths, results, _ = self.calls[0]
        return [k for k in lengths if results.get(k)]

    def generated(self) -> int:
        """Tokens the decoders returned while the tap was entered."""
        return sum(len(tokens) for _, results, _ in self.calls for tokens in results.values())

    def per_row(self) -> dict[Hashable, list[tuple[int, int, float]]]:
        """Per row: (position in the row's sequence, token, log-probability it was drawn with), in order."""
        rows: dict[Hashable, list[tuple[int, int, float]]] = defaultdict(list)
        for lengths, results, logprobs in self.calls:
            for key, tokens in results.items():
                if not tokens:
                    continue
                drawn = logprobs.get(key)
                if drawn is None or len(drawn) != len(tokens):
                    raise TapError(f"{len(drawn or [])} log-probabilities recorded for a turn of {len(tokens)} "
                                   "tokens (was it sampled?)")
                rows[key] += [(lengths[key] + s, token, logp) for s, (token, logp) in enumerate(zip(tokens, drawn))]
        return rows


def decoder_logprobs(tap: SamplingTap, record: dict) -> tuple[list[list[int]], list[list[float]]]:
    """Per rollout row (the record's order): the positions in its completion of the tokens the decoder drew, and
    their log-probabilities; each drawn token is checked against the record's completion at its position."""
    keys, rows = tap.first_keys(), tap.per_row()
    if len(keys) != len(record["completion_ids"]):
        raise TapError(f"the first turn decoded {len(keys)} rows for {len(record['completion_ids'])} episodes")
    positions, logps = [], []
    for key, prompt, completion in zip(keys, record["prompt_ids"], record["completion_ids"]):
        drawn = [(pos - len(prompt), token, logp) for pos, token, logp in rows.get(key, [])]
        if any(not 0 <= pos < len(completion) or completion[pos] != token for pos, token, _ in drawn):
            raise TapError("a drawn token is not in its row's completion at its position")
        positions.append([pos for pos, _, _ in drawn])
        logps.append([logp for _, _, logp in drawn])
    return positions, logps


def trainer_logprobs(trainer: Any, record: dict, positions: list[list[int]], batch_size: int) -> list[list[float]]:
    """The log-probabilities GRPO trains with, at `positions` of each row's completion: the trainer's model under the
    trainer's autocast (`accelerator.autocast()`), TRL's fused LM head at the run's temperature, the prompts
    left-padded and the completions right-padded, `batch_size` rows per forward -- as
    `GRPOTrainer._get_per_token_logps_and_entropies` computes them, read through public attributes only."""
    import torch

    pad_id = trainer.processing_class.pad_token_id
    device = trainer.accelerator.device
    prompts, completions = record["prompt_ids"], record["completion_ids"]
    width_p = max(len(p) for p in prompts)
    width_c = max(len(c) for c in completions)
    out = []
    for start in range(0, len(prompts), batch_size):
        rows = range(start, min(start + batch_size, len(prompts)))
        ids = torch.full((len(rows), width_p + width_c), pad_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            p, c = prompts[r], completions[r]
            ids[i, width_p - len(p): width_p] = torch.tensor(p)
            ids[i, width_p: width_p + len(c)] = torch.tensor(c)
            attention[i, width_p - len(p): width_p + len(c)] = 1
        ids, attention = ids.to(device), attention.to(device)
        labels = ids.masked_fill(attention == 0, -100)
        labels[:, :-width_c] = -100
        with torch.no_grad(), trainer.accelerator.autocast():
            logps = trainer.model(input_ids=ids, attention_mask=attention, labels=labels,
                                  fused_lm_head=True).log_probs[:, -width_c:].float().cpu()
        for i, r in enumerate(rows):
            out.append([float(logps[i, pos]) for pos in positions[r]])
    return out


def logprob_gap(decoder: list[list[float]], trainer: list[list[float]]) -> dict:
    """|trainer − decoder| over every model token: mean (the target's figure), p99, max; the mean signed gap; and the
    spread of the importance ratio exp(trainer − decoder) a correction would apply."""
    diffs = [t - d for rd, rt in zip(decoder, trainer) for d, t in zip(rd, rt)]
    if not diffs:
        raise TapError("no model tokens to compare")
    absolute = sorted(abs(x) for x in diffs)
    ratios = [math.exp(x) for x in diffs]
    return {"tokens": len(diffs), "rows": len(decoder), "mean_abs": round(sum(absolute) / len(absolute), 9),
            "p99_abs": round(absolute[min(len(absolute) - 1, int(0.99 * len(absolute)))], 9),
            "max_abs": round(absolute[-1], 9), "mean_signed": round(sum(diffs) / len(diffs), 9),
            "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}


# ---------------------------------------------------------------------------------------------- GRPO step
class TimedRollout:
    """Wraps a trainer's `rollout_func`: times each call and its peak GPU memory; the first call's record, what the
    decoder sampled in it (`SamplingTap`) and the weights it sampled with are kept for the log-prob gap."""

    def __init__(self, trainer: Any):
        self.inner, self.trainer = trainer.rollout_func, trainer
        trainer.rollout_func = self
        self.seconds = 0.0
        self.peak_gib = None
        self.record = self.tap = self.weights = None

    def __call__(self, prompts: list, trainer: Any) -> dict:
        sync()
        reset_peak()
        start = time.perf_counter()
        with SamplingTap() as tap:
            record = self.inner(prompts, trainer)
        sync()
        self.seconds += time.perf_counter() - start
        self.peak_gib = peak_gib()
        if self.record is None:  # a copy: the trainer may edit the lists it is handed
            self.record, self.tap = copy.deepcopy(record), tap
            model = trainer.accelerator.unwrap_model(trainer.model)
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        reset_peak()
        return record


def step_timer():
    """A `TrainerCallback` timing each optimizer step (device synchronised) and the peak GPU memory at its end."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self.peak_gib = None
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.seconds.append(time.perf_counter() - self._start)
            self.peak_gib = peak_gib()

    return StepTimer()


def memory_probe(trainer: Any, rows: int, length: int, completion: int) -> dict:
    """One forward and backward of `rows` full-length rows (`length` tokens, the last `completion` of them scored)
    through the trainer's model under its autocast, as the GRPO loss runs them: peak GPU memory and seconds. Gradients
    are dropped afterwards; an out-of-memory is reported, not raised."""
    import torch

    model = trainer.model
    device = trainer.accelerator.device
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, vocab, (rows, length), generator=generator).to(device)
    attention = torch.ones_like(ids)
    labels = ids.clone()
    labels[:, :-completion] = -100
    model.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    reset_peak()
    sync()
    start = time.perf_counter()
    try:
        with trainer.accelerator.autocast():
            logps = model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True).log_probs
        (-logps[:, -completion:].float().mean()).backward()
        sync()
        result = {"rows": rows, "tokens": rows * length, "seconds": round(time.perf_counter() - start, 3),
                  "peak_gib": peak_gib(), "oom": False}
        result["tokens_per_s"] = round(result["tokens"] / max(result["seconds"], 1e-9), 1)
    except torch.OutOfMemoryError as exc:
        result = {"rows": rows, "tokens": rows * length, "oom": True, "error": str(exc).splitlines()[0][:200]}
    finally:
        model.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return result
