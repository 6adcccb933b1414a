"""`GraphDecoder`: the kept-cache decoder whose decoding step the GPU runs by itself, captured as a CUDA graph.

`MultiTurnDecoder` spends its time on the host on a GPU: each decoding step is ~30 layers of eager PyTorch, a cache
that grows, a mask built anew, a `.tolist()` per token (~28 ms a step for SmolLM2-135M on an H100, whatever the
rows). This decoder keeps what it does — one turn for many conversations, each keeping its KV cache across turns, the
prefixes the rows' first prompts share read once (all rows' and each group's), the same tokens for the same logits —
and moves the per-token work onto the device:

- **Fixed shapes.** Every conversation owns a slot of a `SlotCache` (keys/values `[slots, heads, length, dim]`) for
  as long as it is asked for; a turn reads only what is new into its slot. Decoding runs on a batch of the first b
  slots, b a power of two (1 .. the slots), over the first W positions (a multiple of `window_step`): a step's
  tensors keep their shapes and addresses, so the step (forward, sampling, end-of-turn checks, bookkeeping) is
  captured once per (b, W, greedy or sampled) as a CUDA graph and replayed.
- **State on the device.** Each slot's position, next token, tokens generated, budget and whether it still decodes
  are device tensors the step updates itself; a row that has ended writes only to the scratch column. The host
  reads them back every `sync_every` steps (8 on a GPU): to stop when every row has ended, to move the rows still
  decoding into a smaller batch when they fit one, and to widen W before a row passes it.
- **Sampling on the device** (`decode_state`): softmax(logits / T) and the draw `argmax(p / q)`, q ~ Exp(1) — the
  algorithm `torch.multinomial` uses for one sample — and the log-probability of each drawn token under that
  distribution, kept in `last_logprobs`. The noise q is drawn before each step, eagerly on the default generator
  (one `exponential_` into a buffer the step reads): a graph replays no random numbers.

The prefill of each turn (the rows' new tokens: a tool result, the first prompt) runs the same arithmetic eagerly.
On a CPU there are no graphs: the same code runs eagerly, every step is checked (`sync_every` 1) and batches are the
rows still decoding (no padding rows); the tests run it so, with `buckets=True, sync_every=4` to play the GPU's
padding rows and late checks. If capturing a graph fails (`step_graphs.StepGraphs`), the decoder says why in
`graphs.error` and goes on eagerly.

    decoder = GraphDecoder(model, pad_id=tokenizer.pad_token_id, eos_ids={tokenizer.eos_token_id})
    first = decoder.generate({"a": ids_a, "b": ids_b}, max_new_tokens=96, sample=True, temperature=0.8)
    later = decoder.generate({"a": ids_a + first["a"] + tool_ids}, max_new_tokens=96)   # "b" ended: forgotten

The model must be one `SlotModel` runs (`supports(model)`); `compute_dtype=torch.bfloat16` over fp32 weights
decodes as a trainer's bf16 autocast computes (see `training.generation.slot_model`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, NamedTuple

from training.generation.decode_state import DecodeState
from training.generation.multi_turn import DecodeStats, KeptRows, common_prefix, shared_prefixes
from training.generation.slot_model import SlotCache, SlotModel
from training.generation.step_graphs import StepGraphs

__all__ = ["GraphDecoder"]

#: Query x key positions one prefill forward may attend over (rows x new tokens x window): bounds its memory.
PREFILL_ELEMENTS = 1 << 24
#: With buckets, slots come in multiples of this (decoding batches are powers of two up to the slots).
SLOT_STEP = 8


@dataclass
class _Row:
    """One conversation kept: the token ids whose keys/values its slot holds, and the slot."""

    ids: list[int]
    slot: int


class StepKey(NamedTuple):
    """What a decoding step's graph is captured for (a failed capture's warning names it)."""

    batch: int
    window: int
    sampled: bool


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class GraphDecoder(KeptRows):
    """Decodes turns of many conversations at once, each keeping its KV cache in a slot across turns; on CUDA each
    decoding step is a replayed CUDA graph (see the module docstring). Same interface as `MultiTurnDecoder`.

    Args:
        model: a causal LM `SlotModel` runs (`supports(model)`), in eval mode.
        pad_id: the token fed on a prefill's padding positions (never attended to; rows are not padded in a slot).
        eos_ids: tokens that end a row's turn.
        min_shared_prefix: the shortest prefix (tokens) that rows starting together read once (default 16).
        share_groups: read each group's longer shared prefix once too (default True; False: the common prefix alone,
            for comparison).
        compute_dtype: None (the weights' dtype) or `torch.bfloat16` over fp32 weights: the trainer's bf16 autocast
            (`SlotModel`); default None.
        lm_head_fp32: with `compute_dtype`, the LM head in fp32 (TRL's `cast_lm_head_to_fp32`); default False.
        graphs: capture decoding steps as CUDA graphs (default: on CUDA).
        buckets: round decoding batches up to powers of two (default: with graphs; a graph per batch size).
        sync_every: decoding steps between two reads of the rows' state (default 8 with graphs, else 1).
        window_step: attention windows are multiples of this (default 256 with graphs, else 1: exact).
    """

    def __init__(self, model: Any, pad_id: int = 0, eos_ids: set[int] | None = None, *, min_shared_prefix: int = 16,
                 compute_dtype: Any = None, lm_head_fp32: bool = False, share_groups: bool = True,
                 graphs: bool | None = None,
                 buckets: bool | None = None, sync_every: int | None = None, window_step: int | None = None):
        self.model = model
        self.pad_id = int(pad_id)
        self.eos_ids = set(eos_ids or ())
        self.min_shared_prefix = min_shared_prefix
        self.share_groups = share_groups
        self.slots = SlotModel(model, compute_dtype=compute_dtype, lm_head_fp32=lm_head_fp32)
        cuda = self.slots.device.type == "cuda"
        if graphs and not cuda:
            raise ValueError("CUDA graphs need the model on a CUDA device")
        graphs = cuda if graphs is None else bool(graphs)
        #: The decoding steps' graphs (`graphs.error`: why capture was given up, if it was).
        self.graphs = StepGraphs(graphs)
        self.buckets = graphs if buckets is None else bool(buckets)
        self.sync_every = max(1, sync_every or (8 if graphs else 1))
        self.window_step = max(1, window_step or (256 if graphs else 1))
        self.stats = DecodeStats()
        #: Per key of the last `generate` call that sampled: the log-probability of each token it drew, under the
        #: distribution it drew it from (softmax(logits / temperature)).
        self.last_logprobs: dict[Hashable, list[float]] = {}
        self._rows: dict[Hashable, _Row] = {}
        self._cache: SlotCache | None = None
        self._state: DecodeState | None = None
        self._weights_key: tuple | None = None
        self._weights_stale = True  # the low-precision weight copies need (re)casting before the next turn

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether `SlotModel` can run `model` (a Llama / Mistral / Qwen2 / Qwen3 layout in float weights)."""
        return SlotModel.unsupported(model) is None

    def forget(self, keys: Any = None) -> None:
        """Drop the caches of `keys`; forgetting all of them (a new play: `play_batched` does it at its start, after
        the weights may have changed) also recasts the low-precision weight copies before the next turn."""
        super().forget(keys)
        if keys is None:
            self._weights_stale = True

    def release(self) -> None:
        """Free the device memory held (slots, state, graphs); the next call allocates anew."""
        self._rows.clear()
        self.graphs.release()
        self._cache = self._state = None

    def memory_bytes(self) -> int:
        """Bytes of the slot cache (the decoder's main allocation)."""
        return self._cache.bytes() if self._cache is not None else 0

    # ------------------------------------------------------------------------------------------------- generate
    def generate(self, sequences: dict[Hashable, list[int]], max_new_tokens: int | dict[Hashable, int], *,
                 sample: bool = False, temperature: float = 1.0) -> dict[Hashable, list[int]]:
        """One turn for every conversation in `sequences` (key -> its whole token ids so far); returns each key's new
        tokens, up to and including its end-of-turn token, at most its `max_new_tokens` (one number, or one per key).

        Conversations kept from earlier calls and not named here are forgotten (their episodes have ended).
        """
        import torch

        for key in [k for k in self._rows if k not in sequences]:
            del self._rows[key]
        budgets = {k: (max_new_tokens[k] if isinstance(max_new_tokens, dict) else max_new_tokens)
                   for k in sequences}
        keys = [k for k, ids in sequences.items() if ids and budgets[k] > 0]
        results: dict[Hashable, list[int]] = {k: [] for k in sequences}
        self.last_logprobs = {}
        if not keys:
            return results
        if sample and not temperature > 0:
            raise ValueError(f"sampling needs a temperature > 0 (got {temperature})")
        try:
            with torch.no_grad():
                self._turn(keys, sequences, budgets, sample, float(temperature), results)
        except BaseException:
            self._rows.clear()  # a turn cut short leaves slots half written: read them anew next time
            raise
        return results

    # ------------------------------------------------------------------------------------------- the turn
    def _turn(self, keys, sequences, budgets, sample, temperature, results) -> None:
        import torch

        keep = self._reuse(keys, sequences)
        n = len(keys)
        columns = max(budgets[k] for k in keys)
        length = max(len(sequences[k]) + budgets[k] for k in keys) + 1  # + the scratch column
        self._ensure(len(set(self._rows) | set(keys)), length, columns)
        self._place(keys)
        keys = sorted(keys, key=lambda k: self._rows[k].slot)  # the i-th sits in slot i
        if self._weights_stale:  # once per play: the weights change between plays (GRPO steps), not within one
            self.slots.refresh()
            self._weights_stale = False
        if self.graphs.enabled and self.slots.weights_key() != self._weights_key:
            self.graphs.clear()  # the weights moved: graphs read their old addresses
            self._weights_key = self.slots.weights_key()

        state = self._state
        device = self.slots.device
        state.active.zero_()
        state.count.zero_()
        state.temperature.fill_(temperature)
        state.budget[:n] = torch.tensor([budgets[k] for k in keys], device=device)
        if sample:
            state.make_noise(self.slots.vocab)
        start = time.perf_counter()
        self._share_prefix(keys, sequences, keep)
        state.pos[:n] = torch.tensor([keep[k] for k in keys], device=device)
        state.active[:n] = True
        self._prefill(keys, sequences, keep, sample)
        now = time.perf_counter()
        self.stats.prefill_seconds += now - start
        steps = self._decode(keys, sequences, budgets, sample)
        self.stats.decode_seconds += time.perf_counter() - now

        # Read back: each row's tokens (up to its end), their log-probabilities, and what its slot now holds.
        slot_of = {k: self._rows[k].slot for k in keys}
        order = sorted(slot_of.values())
        counts = state.count[: order[-1] + 1].tolist()
        width = max(counts[s] for s in order)
        out = state.out[: order[-1] + 1, :width].tolist()
        logps = state.logp[: order[-1] + 1, :width].tolist() if sample else None
        for key in keys:
            s = slot_of[key]
            tokens = out[s][: counts[s]]
            results[key] = tokens
            if logps is not None:
                self.last_logprobs[key] = logps[s][: counts[s]]
            self._rows[key].ids = list(sequences[key]) + tokens[:-1]
        generated = sum(len(results[k]) for k in keys)
        self.stats.generated += generated
        self.stats.fed += generated - n
        self.stats.forward_calls += steps

    def _reuse(self, keys, sequences) -> dict[Hashable, int]:
        """How many leading tokens of each row its slot already holds (the rest is read this turn)."""
        keep = {}
        for key in keys:
            ids, row = sequences[key], self._rows.get(key)
            kept = min(common_prefix(row.ids, ids), len(ids) - 1) if row is not None else 0
            keep[key] = max(kept, 0)
            if row is not None:
                row.ids = row.ids[: keep[key]]
        return keep

    def _bucket(self, n: int) -> int:
        """The decoding batch for n rows: with buckets the next power of two, or every slot when that is fewer."""
        return min(_power_of_two(n), self._cache.rows) if self.buckets else n

    def _ensure(self, slots: int, length: int, columns: int) -> None:
        """At least `slots` slots of `length` positions and `columns` output columns; a cache short of positions
        grows by half at least (a conversation grows turn by turn). A new cache or state drops the graphs captured
        over the old ones."""
        cache = self._cache
        if cache is None or cache.rows < slots or cache.length < length:
            rows = max(slots, cache.rows if cache else 0)
            positions = length
            if cache is not None:
                positions = cache.length if cache.length >= length else max(length, cache.length * 3 // 2)
            rows = -(-rows // SLOT_STEP) * SLOT_STEP if self.buckets else rows
            positions = -(-positions // self.window_step) * self.window_step
            self._check_memory(rows, positions)
            grown = SlotCache(self.slots, rows, positions)
            if cache is not None:
                grown.copy_from(cache)
            self._cache = cache = grown
            self.graphs.clear()
        state = self._state
        if state is None or state.slots < cache.rows or state.columns < columns:
            self._state = DecodeState(cache.rows, max(columns, state.columns if state else 0), self.slots.device,
                                      sorted(self.eos_ids))
            self.graphs.clear()

    def _check_memory(self, rows: int, positions: int) -> None:
        """On a GPU, refuse a slot cache that cannot fit (a clear error where torch would fail mid-allocation)."""
        if self.slots.device.type != "cuda":
            return
        import torch

        device = self.slots.device
        need = SlotCache.bytes_for(self.slots, rows, positions)
        free, _ = torch.cuda.mem_get_info(device)
        # what the device has free, what torch's allocator holds unused (a trainer's loss phase leaves much), and the
        # cache this one replaces
        have = (free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
                + (self._cache.bytes() if self._cache is not None else 0))
        if need > have:
            raise MemoryError(f"the decoder's KV slots for {rows} rows x {positions} positions need "
                              f"{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB free: play fewer episodes at once "
                              "or shorter ones")

    def _place(self, keys: list[Hashable]) -> None:
        """Put the turn's rows in slots 0 .. n-1 (a batch of the first slots is a view: what a graph reads), moving
        only the rows that must: the turn's rows beyond n swap with other kept rows below n, or take free slots."""
        n, turn = len(keys), set(keys)
        held = {row.slot: key for key, row in self._rows.items()}
        low_free = [s for s in range(n) if s not in held]
        high_free = [s for s in range(n, self._cache.rows) if s not in held]
        low_idle = [s for s in range(n) if s in held and held[s] not in turn]
        high_turn = [s for s in range(n, self._cache.rows) if s in held and held[s] in turn]
        target: dict[Hashable, int] = {}
        while high_turn and low_idle:
            high, low = high_turn.pop(), low_idle.pop()
            target[held[high]], target[held[low]] = low, high
        for low in low_idle:
            target[held[low]] = high_free.pop()
            low_free.append(low)
        for high in high_turn:
            target[held[high]] = low_free.pop()
        if target:
            moved = list(target)
            import torch

            device = self.slots.device
            sources = torch.tensor([self._rows[k].slot for k in moved], device=device)
            targets = torch.tensor([target[k] for k in moved], device=device)
            upto = max(len(self._rows[k].ids) for k in moved)
            if upto:
                self._cache.move(sources, targets, upto)
            for key in moved:
                self._rows[key].slot = target[key]
        for key in keys:
            if key not in self._rows:
                self._rows[key] = _Row(ids=[], slot=low_free.pop())

    def _share_prefix(self, keys, sequences, keep) -> None:
        """Rows with nothing kept: the prefixes they share (`shared_prefixes`) read once — the one all of them share
        in the first one's slot, copied into the others'; then each group's longer one in its first member's slot,
        after the common one, copied into the group's other slots."""
        fresh = [k for k in keys if keep[k] == 0]
        plan = shared_prefixes(fresh, sequences, self.min_shared_prefix, groups=self.share_groups)
        if plan.common:
            self._read_shared(fresh, sequences[fresh[0]], 0, plan.common, keep)
        for members, length in plan.groups:
            self._read_shared(members, sequences[members[0]], plan.common, length, keep)

    def _read_shared(self, members: list[Hashable], ids: list[int], start: int, end: int, keep) -> None:
        """Read `ids[start:end]` once into the first member's slot (which holds `ids[:start]`) and copy its
        positions `[0, end)` into the other members' slots."""
        import torch

        device = self.slots.device
        source = self._rows[members[0]].slot
        tokens = torch.tensor([ids[start:end]], device=device)
        positions = torch.arange(start, end, device=device)[None]
        self.slots.forward(self._cache, slice(source, source + 1), tokens, positions, end)
        targets = torch.tensor([self._rows[k].slot for k in members[1:]], device=device)
        self._cache.share(source, targets, end)
        self.stats.fed += end - start
        self.stats.forward_calls += 1
        for key in members:
            keep[key] = end
            self._rows[key].ids = list(ids[:end])

    def _prefill(self, keys, sequences, keep, sample) -> None:
        """Read each row's new tokens into its slot (rows in groups whose attention fits `PREFILL_ELEMENTS`) and
        choose its first token."""
        import torch

        device = self.slots.device
        scratch = self._cache.scratch
        news = [sequences[k][keep[k]:] for k in keys]
        start = 0
        while start < len(keys):
            end, longest, reach = start, 0, 0
            while end < len(keys):
                t, r = max(longest, len(news[end])), max(reach, len(sequences[keys[end]]))
                if end > start and (end + 1 - start) * t * r > PREFILL_ELEMENTS:
                    break
                longest, reach, end = t, r, end + 1
            ids = torch.full((end - start, longest), self.pad_id, dtype=torch.long)
            positions = torch.full((end - start, longest), scratch, dtype=torch.long)
            for i, key in enumerate(keys[start:end]):
                new = news[start + i]
                ids[i, : len(new)] = torch.tensor(new, dtype=torch.long)
                positions[i, : len(new)] = torch.arange(keep[key], keep[key] + len(new))
            last = torch.tensor([len(n) - 1 for n in news[start:end]], device=device)
            rows = slice(start, end)  # the turn's rows sit in slots 0 .. n-1, in `keys` order
            logits = self.slots.forward(self._cache, rows, ids.to(device), positions.to(device),
                                        self._window(reach), last)
            self._state.pos[rows] += last + 1
            if sample:
                self._state.draw(rows)
            self._state.choose(logits, rows, sample)
            self.stats.fed += sum(len(n) for n in news[start:end])
            self.stats.forward_calls += 1
            start = end

    def _window(self, reach: int) -> int:
        """The attention window (a multiple of `window_step`, at most the cache's length) covering `reach`
        positions."""
        return min(self._cache.length, -(-reach // self.window_step) * self.window_step)

    # ------------------------------------------------------------------------------------------ decoding
    def _decode(self, keys, sequences, budgets, sample) -> int:
        """Decode until every row has ended; returns the decoding steps run."""
        state = self._state
        n = len(keys)
        longest_budget = max(budgets[k] for k in keys)
        reach = max(len(sequences[k]) for k in keys)  # every row's slot holds at most this many tokens now
        batch = self._bucket(n)
        steps = 0
        live = state.active[:batch].tolist()
        while any(live) and steps < longest_budget - 1:
            run = min(self.sync_every, longest_budget - 1 - steps)
            step = self._step(batch, self._window(reach + steps + run), sample)
            for _ in range(run):
                step()
            steps += run
            live = state.active[:batch].tolist()
            alive = [s for s, on in enumerate(live) if on]
            smaller = self._bucket(len(alive))
            if alive and smaller < batch:
                self._compact(alive, smaller, reach + steps)
                batch = smaller
                live = state.active[:batch].tolist()
        return steps

    def _compact(self, alive: list[int], batch: int, reach: int) -> None:
        """Move the rows still decoding into slots 0 .. batch-1 (swapping with ended rows there)."""
        by_slot = {row.slot: key for key, row in self._rows.items()}
        outside = [s for s in alive if s >= batch]
        spare = [s for s in range(batch) if s not in set(alive)]
        sources, targets = [], []
        for high, low in zip(outside, spare):
            sources += [high, low]
            targets += [low, high]
            high_key, low_key = by_slot.get(high), by_slot.get(low)
            if high_key is not None:
                self._rows[high_key].slot = low
            if low_key is not None:
                self._rows[low_key].slot = high
        if not sources:
            return
        import torch

        device = self.slots.device
        src, dst = torch.tensor(sources, device=device), torch.tensor(targets, device=device)
        # A swapped-out slot may hold a kept row that is not in this turn (a bucket wider than the turn), whose cache
        # can be longer than the turn's reach: move all of it.
        kept = [len(self._rows[key].ids) for key in map(by_slot.get, sources) if key is not None]
        self._cache.move(src, dst, min(max([reach + 1, *kept]), self._cache.length))
        for tensor in self._state.per_slot():
            tensor[dst] = tensor[src]

    def _step(self, batch: int, window: int, sample: bool) -> Callable[[], None]:
        """The decoding step over slots 0 .. batch-1: a replayed CUDA graph, or the eager function; sampled, after
        drawing its noise."""
        run = self.graphs.runner(StepKey(batch, window, sample),
                                 functools.partial(self._decode_step, batch, window, sample),
                                 functools.partial(self._idle, batch))
        if not sample:
            return run
        rows = slice(0, batch)

        def step() -> None:
            self._state.draw(rows)  # eagerly, before the graph: a graph replays no random numbers
            run()

        return step

    @contextlib.contextmanager
    def _idle(self, batch: int):
        """Every row of the batch inactive: a decoding step then writes only to scratch (no row's cache, position,
        tokens or count changes), as a graph's warm-up run must."""
        state = self._state
        saved = state.active[:batch].clone()
        state.active[:batch] = False
        try:
            yield
        finally:
            state.active[:batch] = saved

    def _decode_step(self, batch: int, window: int, sample: bool) -> None:
        """Feed each decoding row of slots 0 .. batch-1 its next token and choose the one after it; rows that have
        ended write to scratch and keep their state. Reads nothing back to the host."""
        import torch

        state = self._state
        rows = slice(0, batch)
        active = state.active[rows]
        positions = torch.where(active, state.pos[rows], self._cache.scratch)
        logits = self.slots.forward(self._cache, rows, state.token[rows, None], positions[:, None], window)
        state.pos[rows] += active.long()
        state.choose(logits, rows, sample)
