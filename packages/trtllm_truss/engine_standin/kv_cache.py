"""A batched, left-padded KV cache that rows can join and leave between decode steps.

Hugging Face's `DynamicCache` concatenates on every step (a full copy of the cache per token); this one
keeps a buffer with spare capacity per layer and writes the new column in place, so a decode step
costs what the attention costs. Rows are sequences; shorter ones are padded on the left and the
padding is masked by the 2-D attention mask the runner passes (positions are passed explicitly).
Joining (after a request's own prefill) and leaving (finished or cancelled) rebuild the buffers once.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowableKVLayer(DynamicLayer):
    """[batch, heads, length, head_dim] keys/values with room to grow along `length`."""

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0

    def _set(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        batch, heads, length, dim = keys.shape
        self._key_buffer = keys.new_empty(batch, heads, capacity, dim)
        self._value_buffer = values.new_empty(batch, heads, capacity, values.shape[-1])
        self._key_buffer[:, :, :length] = keys
        self._value_buffer[:, :, :length] = values
        self._length = length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._refresh_views()

    def _refresh_views(self) -> None:
        assert self._key_buffer is not None and self._value_buffer is not None
        self.keys = self._key_buffer[:, :, : self._length]
        self.values = self._value_buffer[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        if self._key_buffer is None:
            self._set(key_states, value_states, capacity=key_states.shape[-2] + 64)
            return self.keys, self.values
        if self._length + new > self._key_buffer.shape[-2]:
            self._set(self.keys, self.values, capacity=2 * (self._length + new))
        self._key_buffer[:, :, self._length : self._length + new] = key_states
        self._value_buffer[:, :, self._length : self._length + new] = value_states
        self._length += new
        self._refresh_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self._length = 0
        super().reset()


class BatchKVCache(DynamicCache):
    """A `DynamicCache` of `GrowableKVLayer`s plus the row operations continuous batching needs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowableKVLayer

    @property
    def length(self) -> int:
        return self.layers[0].get_seq_length() if self.layers else 0

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.layers]

    def _replace(self, tensors: list[tuple[torch.Tensor, torch.Tensor]], spare: int = 64) -> None:
        self.layers = []
        for keys, values in tensors:
            layer = GrowableKVLayer()
            layer._set(keys, values, capacity=keys.shape[-2] + spare)
            self.layers.append(layer)

    def keep_rows(self, rows: list[int], drop_leading: int = 0) -> None:
        """Keep only `rows` (in that order) and drop `drop_leading` columns that are padding in all of them."""
        index = torch.tensor(rows, dtype=torch.long)
        self._replace([(k[index, :, drop_leading:], v[index, :, drop_leading:]) for k, v in self.layer_tensors()])

    def append_rows(self, other: BatchKVCache) -> None:
        """Add `other`'s rows below ours, left-padding whichever is shorter (padding is masked by the caller)."""
        if not self.layers:
            self._replace(other.layer_tensors())
            return
        mine, theirs = self.length, other.length
        width = max(mine, theirs)
        merged = []
        for (k1, v1), (k2, v2) in zip(self.layer_tensors(), other.layer_tensors()):
            merged.append((torch.cat([_left_pad(k1, width), _left_pad(k2, width)]), torch.cat([_left_pad(v1, width), _left_pad(v2, width)])))
        self._replace(merged)


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[-2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], tensor.shape[1], missing, tensor.shape[3])
    return torch.cat([pad, tensor], dim=-2)
