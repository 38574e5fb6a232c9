"""The interface the sampler, the trainer and sharding rely on. A new model is one new package
that implements `CausalLM` (its caches `Cache` / `SlotCache`) and registers in
`t2t_jax.models.FAMILIES`.

The KV cache is a layout behind a protocol, as MaxText keeps paging out of its layers: a model's
layers never see whether the cache is dense (`qwen3.KVCache`, [B, K, S, E] per layer) or paged
(`paged.PagedKV`, a pool of pages and a page table). A call with T new tokens per row asks the
cache where they sit (`positions`); each layer `write`s its keys and values into its store and
`attend`s over it; `advance` gives the cache after the call. The continuous-batching engine
moves whole rows (decode slots) through `SlotCache`.

Shapes: B rows, T tokens, D hidden size, V vocabulary, C completion tokens, H query heads, K kv
heads, E head_dim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class Kernels:
    """A model's attention kernels, handed to its cache's `write` / `attend`.

    dense: `(q [B, H, T, E], k, v [B, K, S, E], mask [B, T, S], pad [B, T] | None) -> [B, T, H * E]`
      (models/attention.py `attend` with the model's kernel); paged: the decode kernel of a paged
      cache (models/paged.py KERNELS); mesh: the devices they run on (None: one)."""

    dense: Callable
    paged: str = "gather"
    mesh: Any = None


@runtime_checkable
class Cache(Protocol):
    """A KV cache layout: a pytree whose per-row arrays lead with B; `k`, `v`: one store per layer
    (a layer's store is the pair (k[i], v[i]), arrays of the layout's shape)."""

    k: tuple
    v: tuple

    def map_rows(self, fn: Callable) -> Cache:
        """`fn` on every per-row array ([B, ...] -> [B', ...]); what rows share is kept."""
        ...

    def positions(self, mask) -> Any:
        """This call's tokens, mask [B, T] bool (real tokens) -> their RoPE positions [B, T] int32."""
        ...

    def write(self, store: tuple, k, v, mask, kernels: Kernels) -> tuple:
        """This call's keys and values k, v [B, K, T, E] (in the store's dtype) into one layer's
        store -> the store."""
        ...

    def attend(self, store: tuple, q, mask, kernels: Kernels) -> Any:
        """q [B, H, T, E] over one layer's store (this call's keys written) -> [B, T, H * E]."""
        ...

    def advance(self, stores: Sequence[tuple], mask) -> Cache:
        """The cache after the call: every layer's written store, the rows moved on by mask [B, T]."""
        ...


@runtime_checkable
class SlotCache(Cache, Protocol):
    """A cache whose rows are decode slots, each at its own point (the engine's). Columns: what
    a row's cache is cut into (dense: token slots; paged: page table entries)."""

    def columns(self) -> int:
        """Columns per row."""
        ...

    def with_table(self, table) -> SlotCache:
        """The host's row map: a paged cache's page table [S, N] (page ids); a dense cache's
        rows are its slots (table None: itself)."""
        ...

    def admit(self, prefill: Cache, src, dst) -> SlotCache:
        """Rows src [S] of a dense `prefill` cache (left-padded prompts) into slots dst [S] (S:
        no-op; paged: into the pages the table gives them)."""
        ...

    def take(self, idx, window: int) -> SlotCache:
        """Slots idx [R], cut to their first `window` columns (what rows share is kept whole)."""
        ...

    def put(self, sub: SlotCache, idx, window: int) -> SlotCache:
        """`take`'s inverse: `sub` written back into slots idx."""
        ...


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model as an nnx.Module."""

    config: Any

    def __call__(self, input_ids, attention_mask=None, cache: Cache | None = None, layers=None, prefill=False):
        """Logits [B, T, V] (and the updated cache when one is given)."""
        ...

    def hidden(self, input_ids, attention_mask=None, cache: Cache | None = None, layers=None, prefill=False):
        """Final hidden states [B, T, D] (and the updated cache when one is given); `layers`:
        the per-layer weights of `unstack_layers()`, for decode steps; `prefill`: the cache is
        empty (its first call), so attention may run within the prompt."""
        ...

    def init_cache(self, batch: int, length: int, dtype=None) -> Cache:
        """An empty dense cache for `batch` rows of up to `length` tokens."""
        ...

    def init_paged_cache(self, slots: int, pages: int, page_size: int, pages_per_slot: int, dtype=None) -> SlotCache:
        """An empty paged cache: `pages` pages of `page_size` tokens per layer shared by `slots`
        slots of up to `pages_per_slot` pages each."""
        ...

    def unstack_layers(self) -> tuple:
        """One weight dict per layer, made once per generation (see `hidden`'s `layers`)."""
        ...

    def logits_from_hidden(self, h):
        """[..., D] -> [..., V] float32."""
        ...

    def token_logprobs(self, h, targets, chunk: int = 256, temperature: float = 1.0, with_entropy: bool = False):
        """Log-probs [B, C] of `targets` [B, C] from hidden states [B, C, D] (and entropies
        [B, C] when asked), the vocabulary in chunks of `chunk` positions."""
        ...

    def named_params(self) -> dict:
        """Weight name -> its nnx.Param."""
        ...

    @staticmethod
    def logical_axes(name: str) -> tuple:
        """The logical axes of weight `name` (t2t_jax.sharding maps them to mesh axes)."""
        ...
