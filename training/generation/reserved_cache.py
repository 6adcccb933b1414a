"""`ReservedLayer`: a KV-cache layer that writes each new token into room reserved ahead.

transformers' `DynamicLayer` grows by concatenation, copying the whole cache at every decoded token. On a CPU, once
16 rows hold ~1,000 tokens each, that copy costs more than the model's own matmuls (a profile of one SmolLM2
decoding step: 89% of the time in `aten::cat`). `MultiTurnDecoder` batches its rows into these layers instead:
the turn's new tokens and its decoding are written in place, and `keys`/`values` are views of the filled part.
"""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import DynamicLayer

__all__ = ["ReservedLayer"]


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` over a buffer `[batch, heads, room, head_dim]` of which the first `length` positions are
    filled; `update` writes into the rest (growing the room by half when it runs out), `batch_select_indices`
    keeps rows, `crop` forgets the last positions.

    Args:
        keys, values: the buffers, their first `length` positions filled.
        length: how many positions are filled.
    """

    def __init__(self, keys: Any, values: Any, length: int):
        super().__init__()
        self._keys, self._values, self.length = keys, values, length
        self.device, self.is_initialized = keys.device, True
        self._expose()

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        n = key_states.shape[-2]
        if self.length + n > self._keys.shape[-2]:
            room = max(self.length + n, self._keys.shape[-2] * 3 // 2)
            grown = []
            for old in (self._keys, self._values):
                new = old.new_zeros((*old.shape[:2], room, old.shape[-1]))
                new[:, :, : self.length] = old[:, :, : self.length]
                grown.append(new)
            self._keys, self._values = grown
        self._keys[:, :, self.length: self.length + n] = key_states
        self._values[:, :, self.length: self.length + n] = value_states
        self.length += n
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: Any) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._expose()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()
