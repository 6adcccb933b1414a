"""`MultiTurnDecoder`: batched decoding of many conversations, each keeping its KV cache from one turn to the next.

An agent's episode is a conversation that grows by a generated turn and a tool result at a time. Decoding each turn
from the whole conversation re-reads everything said so far (about ten tokens fed for every token generated on
SQLEnv's episodes). This decoder keeps, for every row, the keys and values of the tokens it has already read, so a
turn feeds only what is new (the end of the last turn and the tool result); the prefix the rows' first prompts share
(system prompt, tool schemas) is read once for all of them, and so is the longer prefix each group of rows shares
(GRPO's G episodes of one question start from one prompt: its question and schema are read once, not G times,
`shared_prefixes`); a row that ends its turn leaves the batch (its cache is
set aside for its next turn) while the others decode on; a conversation no longer asked for is forgotten.

    decoder = MultiTurnDecoder(model, pad_id=tokenizer.pad_token_id, eos_ids={tokenizer.eos_token_id})
    first = decoder.generate({"a": ids_a, "b": ids_b}, max_new_tokens=96)
    later = decoder.generate({"a": ids_a + first["a"] + tool_ids}, max_new_tokens=96)   # "b" ended: forgotten

Each row sits at its own positions (0 .. its length - 1), whatever padding the batch needs, so a row decodes as it
would alone; greedy decoding (`sample=False`) takes the argmax, sampling draws from softmax(logits / temperature) —
the distribution of the re-reading decoder (`training.generation.decoding.decode_pruned`). What a row asks for need
not extend what it was: the longest common prefix with its cached tokens is kept and the rest read anew (a trimmed
context, say). Models whose cache is not a plain per-layer key/value store (sliding windows, linear attention) are
not supported: `supports(model)` says so, and callers then re-read (`generate_new_tokens`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Hashable

__all__ = ["MultiTurnDecoder", "DecodeStats", "SharedPrefixes", "common_prefix", "shared_prefixes"]


@dataclass
class DecodeStats:
    """What a decoder has done: tokens fed to the model (prompt and tool tokens read, plus one per decoding step),
    tokens generated, forward calls; `fed / generated` is the reading overhead. And where its time went, in host
    wall seconds (exact on a CPU; on a GPU the work queued, not done): `prefill_seconds` reading each turn's new tokens
    (shared prefixes included), `decode_seconds` generating token by token."""

    fed: int = 0
    generated: int = 0
    forward_calls: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"fed": self.fed, "generated": self.generated, "forward_calls": self.forward_calls,
                "prefill_seconds": round(self.prefill_seconds, 3), "decode_seconds": round(self.decode_seconds, 3)}


@dataclass
class _Row:
    """One conversation's cache: the token ids whose keys/values are held, and those keys/values per layer
    (each `[heads, len(ids), head_dim]`, compact: no padding)."""

    ids: list[int]
    layers: list[tuple[Any, Any]] = field(default_factory=list)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class SharedPrefixes:
    """What rows starting together read once: `common` tokens that every row starts with (0: none worth it), then,
    per group of rows that share more, the group's keys and the length of its shared prefix (> `common`)."""

    common: int
    groups: list[tuple[list[Hashable], int]]


def shared_prefixes(keys: list[Hashable], sequences: dict[Hashable, list[int]], min_shared: int, *,
                    groups: bool = True) -> SharedPrefixes:
    """The prefixes worth reading once among rows that start now (`keys`, nothing cached): the prefix all of them
    share, and the longer prefix each group of them shares, when at least `min_shared` tokens long (a group's: beyond
    the common one). Every row keeps at least its last token to read itself (its logits choose its first token).
    Rows are grouped by their first member's prefix, in order: GRPO's groups are runs of identical prompts.
    `groups=False`: the common prefix alone (what the decoders read once before groups were; for comparison)."""
    room = {k: len(sequences[k]) - 1 for k in keys}
    if len(keys) < 2:
        return SharedPrefixes(0, [])
    first = sequences[keys[0]]
    common = min(room.values())
    for key in keys[1:]:
        common = min(common, common_prefix(first, sequences[key]))
    common = common if common >= min_shared else 0
    if not groups:
        return SharedPrefixes(common, [])
    found: list[list[Any]] = []  # [members, the prefix they all share]
    for key in keys:
        for group in found:
            shared = min(group[1], room[key], common_prefix(sequences[group[0][0]], sequences[key]))
            if shared - common >= min_shared:
                group[0].append(key)
                group[1] = shared
                break
        else:
            found.append([[key], room[key]])
    return SharedPrefixes(common, [(members, length) for members, length in found if len(members) >= 2])


class KeptRows:
    """What the kept-cache decoders share: `_rows`, each conversation's kept cache by key (an object with `ids`)."""

    _rows: dict[Hashable, Any]

    def forget(self, keys: Any = None) -> None:
        """Drop the caches of `keys` (default: all)."""
        if keys is None:
            self._rows.clear()
        for key in keys or ():
            self._rows.pop(key, None)

    def cached_ids(self, key: Hashable) -> list[int] | None:
        """The token ids whose keys/values `key`'s cache holds (None when it holds none)."""
        row = self._rows.get(key)
        return list(row.ids) if row is not None else None


class MultiTurnDecoder(KeptRows):
    """Decodes turns of many conversations at once, each conversation keeping its KV cache across turns.

    Args:
        model: a causal LM whose cache is a plain `DynamicCache` of key/value layers (Llama, Qwen, Mistral without a
            sliding window...).
        pad_id: the token fed on padding positions (never attended to).
        eos_ids: tokens that end a row's turn.
        min_shared_prefix: the shortest prefix (in tokens) that rows starting together read once for all of them
            (default 16; below that, sharing saves less than the copies cost).
        autocast_dtype: `torch.bfloat16` (or float16) to run every forward under `torch.autocast` in that dtype, as a
            trainer's mixed precision computes; default None (the weights' dtype). `kept_cache_decoder` prefers the
            graph decoder for it, which casts the weights once per play rather than at every step.
        share_groups: read each group's longer shared prefix once too (default True; False reads only the prefix
            all starting rows share, as before groups were: for comparison).
    """

    def __init__(self, model: Any, pad_id: int, eos_ids: set[int], *, min_shared_prefix: int = 16,
                 autocast_dtype: Any = None, share_groups: bool = True):
        self.model = model
        self.autocast_dtype = autocast_dtype
        self.share_groups = share_groups
        self.pad_id = int(pad_id)
        self.eos_ids = set(eos_ids)
        self.min_shared_prefix = min_shared_prefix
        self.stats = DecodeStats()
        #: Per key of the last `generate` call that sampled: the log-probability of each token it drew, under the
        #: distribution it drew it from (softmax(logits / temperature)).
        self.last_logprobs: dict[Hashable, list[float]] = {}
        self._rows: dict[Hashable, _Row] = {}

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether `model`'s cache is plain full-attention key/value layers (what this decoder keeps and slices)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        config = getattr(model, "config", None)
        if config is None:
            return False
        try:
            layers = DynamicCache(config=config).layers
        except Exception:  # noqa: BLE001 - an unusual config: re-read instead
            return False
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

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
        keys = [k for k, ids in sequences.items() if ids]
        budgets = {k: (max_new_tokens[k] if isinstance(max_new_tokens, dict) else max_new_tokens) for k in keys}
        keys = [k for k in keys if budgets[k] > 0]
        results: dict[Hashable, list[int]] = {k: [] for k in sequences}
        self.last_logprobs = {k: [] for k in keys} if sample else {}
        if not keys:
            return results
        try:
            with torch.no_grad():
                start = time.perf_counter()
                reused = self._reuse(keys, sequences)
                self.stats.prefill_seconds += time.perf_counter() - start
                self._decode(keys, sequences, reused, budgets, sample, temperature, results)
        except BaseException:
            self._rows.clear()  # a turn cut short leaves rows half moved into its batch: read them anew next time
            raise
        return results

    def _reuse(self, keys: list[Hashable], sequences: dict[Hashable, list[int]]) -> dict[Hashable, int]:
        """How many leading tokens of each row are already in its cache (cropping what no longer matches); rows
        with nothing cached get the prefixes they share read once (`shared_prefixes`): the one all of them share,
        then each group's longer one on top of it."""
        reused: dict[Hashable, int] = {}
        fresh = []
        for key in keys:
            ids = sequences[key]
            row = self._rows.get(key)
            keep = min(common_prefix(row.ids, ids), len(ids) - 1) if row is not None else 0
            if keep <= 0:
                self._rows.pop(key, None)
                fresh.append(key)
                continue
            if keep < len(row.ids):
                row.ids = row.ids[:keep]
                row.layers = [(k[:, :keep], v[:, :keep]) for k, v in row.layers]
            reused[key] = keep
        plan = shared_prefixes(fresh, sequences, self.min_shared_prefix, groups=self.share_groups)
        common: list[tuple[Any, Any]] = []
        if plan.common:
            ids = sequences[fresh[0]][: plan.common]
            common = self._prefill_alone(ids)
            for key in fresh:
                self._rows[key] = _Row(ids=list(ids), layers=list(common))
                reused[key] = plan.common
        for members, length in plan.groups:
            ids = sequences[members[0]][:length]
            layers = self._prefill_alone(ids, past=common)
            for key in members:
                self._rows[key] = _Row(ids=list(ids), layers=list(layers))
                reused[key] = length
        for key in fresh:
            reused.setdefault(key, 0)
        return reused

    def _prefill_alone(self, ids: list[int], past: list[tuple[Any, Any]] = ()) -> list[tuple[Any, Any]]:
        """Keys/values of `ids` read as one row, after `past` (the keys/values of its first tokens, already read)."""
        import torch
        from transformers import DynamicCache

        device = self._device()
        cache = DynamicCache(config=self.model.config)
        start = past[0][0].shape[1] if past else 0
        for layer, (k, v) in enumerate(past):
            cache.update(k[None], v[None], layer)
        self._forward(input_ids=torch.tensor([ids[start:]], device=device), cache=cache, use_cache=True,
                      position_ids=torch.arange(start, len(ids), device=device)[None], logits_to_keep=1)
        self.stats.fed += len(ids) - start
        self.stats.forward_calls += 1
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]

    def _forward(self, **inputs: Any) -> Any:
        """The model's forward, under autocast when the decoder computes in a lower precision."""
        if self.autocast_dtype is None:
            return self.model(**inputs)
        import torch

        with torch.autocast(self._device().type, dtype=self.autocast_dtype):
            return self.model(**inputs)

    def _device(self) -> Any:
        return next(self.model.parameters()).device

    def _batched_cache(self, keys: list[Hashable], reused: dict[Hashable, int], room: int):
        """A cache holding every row's kept keys/values, left-padded to the longest, with `room` more positions
        reserved (the turn's new tokens and its decoding), and its padding mask."""
        import torch
        from transformers import DynamicCache
        from transformers.cache_utils import Cache

        from training.generation.reserved_cache import ReservedLayer

        device = self._device()
        width = max(reused[k] for k in keys)
        mask = torch.zeros((len(keys), width), dtype=torch.long, device=device)
        if width == 0:
            return DynamicCache(config=self.model.config), mask
        template = next(self._rows[k].layers for k in keys if reused[k] > 0)
        layers = []
        for layer in range(len(template)):
            k0, v0 = template[layer]
            keys_t = k0.new_zeros((len(keys), k0.shape[0], width + room, k0.shape[-1]))
            values_t = v0.new_zeros((len(keys), v0.shape[0], width + room, v0.shape[-1]))
            for i, key in enumerate(keys):
                n = reused[key]
                if n:
                    k, v = self._rows[key].layers[layer]
                    keys_t[i, :, width - n: width] = k[:, :n]
                    values_t[i, :, width - n: width] = v[:, :n]
                    # The batch holds it now: let the row's copy go (the row's cache is set aside anew when its
                    # turn ends), so a turn never holds every row's cache twice.
                    self._rows[key].layers[layer] = None
            layers.append(ReservedLayer(keys_t, values_t, width))
        for i, key in enumerate(keys):
            if reused[key]:
                mask[i, width - reused[key]:] = 1
        return Cache(layers=layers), mask

    def _decode(self, keys, sequences, reused, budgets, sample, temperature, results) -> None:
        import torch

        start = time.perf_counter()  # the turn's prefill: its cache assembled, its new tokens read
        device = self._device()
        news = [sequences[k][reused[k]:] for k in keys]
        chunk = max(len(n) for n in news)
        cache, mask = self._batched_cache(keys, reused, chunk + max(budgets[k] for k in keys))
        input_ids = torch.full((len(keys), chunk), self.pad_id, dtype=torch.long)
        positions = torch.zeros((len(keys), chunk), dtype=torch.long)
        chunk_mask = torch.zeros((len(keys), chunk), dtype=torch.long)
        for i, (key, new) in enumerate(zip(keys, news)):
            input_ids[i, chunk - len(new):] = torch.tensor(new, dtype=torch.long)
            positions[i, chunk - len(new):] = torch.arange(reused[key], reused[key] + len(new))
            chunk_mask[i, chunk - len(new):] = 1
        mask = torch.cat([mask, chunk_mask.to(device)], dim=1)
        next_position = torch.tensor([len(sequences[k]) for k in keys], device=device)
        logits = self._forward(input_ids=input_ids.to(device), attention_mask=mask, position_ids=positions.to(device),
                               cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        self.stats.fed += sum(len(n) for n in news)
        self.stats.forward_calls += 1
        now = time.perf_counter()
        self.stats.prefill_seconds += now - start
        start = now
        try:
            self._decode_steps(keys, sequences, budgets, sample, temperature, results, logits, cache, mask,
                               next_position)
        finally:
            self.stats.decode_seconds += time.perf_counter() - start

    def _decode_steps(self, keys, sequences, budgets, sample, temperature, results, logits, cache, mask,
                      next_position) -> None:
        import torch

        device = self._device()
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        live = list(range(len(keys)))  # batch row -> index into keys
        budget = torch.tensor([budgets[k] for k in keys], device=device)
        step = 0
        while True:
            if sample:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                token = torch.multinomial(probs, 1).squeeze(1)
                # one read back for the tokens and their log-probabilities (ids are exact in float64)
                drawn = torch.stack([token.double(), probs.gather(1, token[:, None]).squeeze(1).log().double()])
                values, logps = drawn.tolist()
                for i, logp in zip(live, logps):
                    self.last_logprobs[keys[i]].append(logp)
                values = [int(v) for v in values]
            else:
                token = logits.argmax(dim=-1)
                values = token.tolist()
            for i, value in zip(live, values):
                results[keys[i]].append(value)
            self.stats.generated += len(live)
            step += 1
            finished = torch.isin(token, eos) | (budget <= step)
            if bool(finished.any()):
                done = finished.nonzero().squeeze(1).tolist()
                for b in done:  # set each ending row's cache aside: the tokens read so far, padding removed
                    key = keys[live[b]]
                    valid = mask[b].bool()
                    self._rows[key] = _Row(
                        ids=list(sequences[key]) + results[key][:-1],
                        layers=[(layer.keys[b][:, valid], layer.values[b][:, valid]) for layer in cache.layers])
                if bool(finished.all()):
                    return
                keep = (~finished).nonzero().squeeze(1)
                for layer in cache.layers:
                    layer.batch_select_indices(keep)
                live = [live[b] for b in keep.tolist()]
                token, mask, next_position, budget = token[keep], mask[keep], next_position[keep], budget[keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self._forward(input_ids=token[:, None], attention_mask=mask,
                                   position_ids=next_position[:, None], cache=cache, use_cache=True).logits[:, -1, :]
            next_position = next_position + 1
            self.stats.fed += len(live)
            self.stats.forward_calls += 1
