"""The interface the sampler, the trainer and sharding rely on. A new model is one new package
that implements `CausalLM` (its cache `Cache`) and registers in `t2t_jax.models.FAMILIES`.

Shapes: B rows, T tokens, D hidden size, V vocabulary, C completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Cache(Protocol):
    """A KV cache: a pytree whose per-row arrays lead with B."""

    def map_rows(self, fn: Callable) -> Cache:
        """`fn` on every per-row array ([B, ...] -> [B', ...]); what rows share is kept."""
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
        """An empty cache for `batch` rows of up to `length` tokens."""
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
