"""The master's cache layer at a concat-fused layer: its entries live in the layer's JointBuffer, written once.

A fused concat layer attends over [slots | own keys] in its `JointBuffer` and reads from the master's cache only the
new tokens' keys. A `DynamicLayer` there would keep a second copy of every own key and re-concatenate it at every
decode step (about 15 ms a step at batch 16 on this CPU, as much as the slots' extra attention). `JointLayer` writes
the new keys straight into the buffer's own region (gpt-fast's pre-allocated cache) and hands transformers views of
it, so the buffer is the only copy.

The layer holds the *runtime*, not a buffer: continuous batching replaces a runtime's buffer when rows join
(`join.join`) or leave (`JointBuffer.select`), and the layer's entries follow it. On a sliding layer it reports the
mask sizes a `DynamicSlidingWindowLayer` would (transformers builds the sliding mask of the unfused layers from the
first sliding layer's sizes) while keeping every entry: the fused attention applies the window itself.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from ..errors import FusionLabError
from .attention_core import LayerRuntime


class JointLayer(CacheLayerMixin):
    """One master layer's cache entries, as views of `runtime.joint`'s own region."""

    is_croppable = False

    def __init__(self, runtime: LayerRuntime, sliding_window: int | None = None) -> None:
        self.runtime = runtime
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.entries = 0
        """Own entries written (the same for every row: rows are left padded)."""
        self.is_initialized = False

    @property
    def keys(self) -> torch.Tensor:  # (B, H_kv, entries, D), a view
        j = self.runtime.joint
        return j.k[:, :, j.own_offset:j.own_offset + self.entries]

    @property
    def values(self) -> torch.Tensor:
        j = self.runtime.joint
        return j.v[:, :, j.own_offset:j.own_offset + self.entries]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """key/value_states (B, H_kv, Q, D): the new tokens' entries, written in place; returns every entry."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        j, q = self.runtime.joint, key_states.shape[2]
        start = j.own_offset + self.entries
        j.k[:, :, start:start + q] = key_states  # a slice copy, not an index_put: decode's hot path
        j.v[:, :, start:start + q] = value_states
        self.entries += q
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.entries

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) as the layer this one stands in for reports them."""
        if self.sliding_window is None:
            return self.entries + query_length, 0
        full = self.entries >= self.sliding_window
        offset = max(self.entries - self.sliding_window + 1, 0)
        return (self.sliding_window - 1 if full else self.entries) + query_length, offset

    def get_max_length(self) -> int:
        return self.sliding_window if self.sliding_window is not None else -1

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Nothing to do: `SequenceState.select` selects the buffer's rows."""

    def reset(self) -> None:
        self.entries, self.is_initialized = 0, False

    def _unsupported(self, what: str) -> None:
        raise FusionLabError(f"{what} on a fused sequence's cache: its concat layers live in the slot buffers, so "
                             "they cannot be moved or reordered alone; use the SequenceState's own methods (select), "
                             "or run the master alone for beam search / cache offloading.")

    def offload(self) -> None:
        self._unsupported("offload()")

    def prefetch(self) -> None:
        self._unsupported("prefetch()")

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self._unsupported("reorder_cache()")


def joint_cache(config: object, runtimes: dict[int, LayerRuntime]) -> DynamicCache:
    """The master's cache for one batch: a `JointLayer` at every layer with a JointBuffer, transformers' own layer
    elsewhere. A JointLayer stands in only for a plain or sliding-window layer: any other kind (a layer that reuses
    another's cache, chunked attention) is refused, since its new keys would never reach the buffer."""
    cache = DynamicCache(config=config)
    for i, rt in runtimes.items():
        if rt.joint is None:
            continue
        layer = cache.layers[i] if i < len(cache.layers) else None
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise FusionLabError(f"layer_map: master layer {i} keeps a {type(layer).__name__} cache, which a concat "
                                 "slave cannot share; map the slave to plain or sliding-window attention layers, or "
                                 "use mode='replace' or 'blend' there.")
        cache.layers[i] = JointLayer(rt, getattr(layer, "sliding_window", None))
    return cache


__all__ = ["JointLayer", "joint_cache"]
