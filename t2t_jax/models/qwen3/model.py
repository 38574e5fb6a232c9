"""Qwen3 (dense) in Flax NNX, exactly as Hugging Face's `Qwen3ForCausalLM` computes it.

RMSNorm (fp32 accumulation), grouped-query attention with per-head q/k RMSNorm before RoPE,
SwiGLU MLP, tied or untied embeddings, `head_dim` independent of hidden / heads. The layers are
stacked (every weight has a leading `[L]` axis) and run under one `jax.lax.scan`, so one layer
body is compiled, with an optional remat policy. Positions come from the attention mask
(cumulative sum), so left padding is harmless. A KV cache serves the sampler: `prefill` fills
it from a prompt, then each call with one token per row appends at `cache.index`.

Shapes: B batch, T tokens, D hidden, H query heads, K kv heads, E head_dim, F intermediate,
V vocab, L layers, S cache length.
"""
from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from t2t_jax.models.qwen3.presets import Qwen3Config

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Per-layer weights: name -> (shape in terms of the config, logical axes).
LAYER_WEIGHTS = {
    "input_norm": (lambda c: (c.hidden_size,), ("embed",)),
    "q_proj": (lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim), ("embed", "q_heads")),
    "k_proj": (lambda c: (c.hidden_size, c.num_key_value_heads * c.head_dim), ("embed", "kv_heads")),
    "v_proj": (lambda c: (c.hidden_size, c.num_key_value_heads * c.head_dim), ("embed", "kv_heads")),
    "o_proj": (lambda c: (c.num_attention_heads * c.head_dim, c.hidden_size), ("q_heads", "embed")),
    "q_norm": (lambda c: (c.head_dim,), ("head_dim",)),
    "k_norm": (lambda c: (c.head_dim,), ("head_dim",)),
    "post_norm": (lambda c: (c.hidden_size,), ("embed",)),
    "gate_proj": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "up_proj": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "down_proj": (lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed")),
}
NORMS = ("input_norm", "q_norm", "k_norm", "post_norm")


@chex.dataclass
class KVCache:
    """k, v: [L, B, K, S, E]; valid: [B, S] bool (filled, non-pad slots); next_pos: [B] int32
    position of the next token per row; index: [] int32 next slot (shared by all rows)."""

    k: chex.Array
    v: chex.Array
    valid: chex.Array
    next_pos: chex.Array
    index: chex.Array


def rms_norm(x, weight, eps):
    """x: [..., N]; normalised in fp32, scaled by weight, cast back to x's dtype."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * xf).astype(x.dtype)


def rope(positions, head_dim, theta):
    """positions: [B, T] -> (cos, sin): [B, T, E] in fp32 (HF's rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
    """x: [B, N, T, E]; cos, sin: [B, T, E]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    xf = x.astype(jnp.float32)
    return (xf * cos[:, None] + rotated.astype(jnp.float32) * sin[:, None]).astype(x.dtype)


def _attend(q, k, v, mask):
    """q: [B, K, G, T, E]; k, v: [B, K, S, E]; mask: [B, T, S] -> [B, K, G, T, E]."""
    scores = jnp.einsum("bkgte,bkse->bkgts", q, k, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bkse->bkgte", probs, v)


def attention(q, k, v, mask, chunk: int = 0):
    """q: [B, H, T, E]; k, v: [B, K, S, E]; mask: [B, T, S] bool -> [B, T, H * E].

    Grouped-query: each kv head serves H / K query heads. Softmax in fp32. With `chunk` > 0 and
    T > chunk, queries go in blocks of `chunk` under `lax.map`, each block rematerialised in the
    backward pass: the [H, T, S] scores never exist at once (peak [H, chunk, S])."""
    b, h, t, e = q.shape
    kv = k.shape[1]
    q = q.reshape(b, kv, h // kv, t, e)
    if chunk and t > chunk and t % chunk == 0:
        qc = q.reshape(b, kv, h // kv, t // chunk, chunk, e).transpose(3, 0, 1, 2, 4, 5)
        mc = mask.reshape(b, t // chunk, chunk, -1).transpose(1, 0, 2, 3)
        block = jax.checkpoint(lambda args: _attend(args[0], k, v, args[1]))
        out = jax.lax.map(block, (qc, mc)).transpose(1, 2, 3, 0, 4, 5).reshape(b, kv, h // kv, t, e)
    else:
        out = _attend(q, k, v, mask)
    return out.reshape(b, h, t, e).transpose(0, 2, 1, 3).reshape(b, t, h * e)


def _layer(config: Qwen3Config, x, w, cos, sin, mask, cache_kv=None, index=None, attn_chunk: int = 0):
    """One decoder layer. x: [B, T, D]; w: this layer's weights; cache_kv: this layer's cached
    ([B, K, S, E] x 2), with this step's keys/values going to slot `index` (None: attend
    within x only). Returns (x, (k, v)), this step's keys and values [B, K, T, E]."""
    c = config
    b, t, _ = x.shape
    h = rms_norm(x, w["input_norm"], c.rms_norm_eps)
    q = (h @ w["q_proj"]).reshape(b, t, c.num_attention_heads, c.head_dim)
    k = (h @ w["k_proj"]).reshape(b, t, c.num_key_value_heads, c.head_dim)
    v = (h @ w["v_proj"]).reshape(b, t, c.num_key_value_heads, c.head_dim)
    q = rms_norm(q, w["q_norm"], c.rms_norm_eps).transpose(0, 2, 1, 3)
    k = rms_norm(k, w["k_norm"], c.rms_norm_eps).transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if cache_kv is not None:
        k_all = jax.lax.dynamic_update_slice_in_dim(cache_kv[0], k.astype(cache_kv[0].dtype), index, axis=2)
        v_all = jax.lax.dynamic_update_slice_in_dim(cache_kv[1], v.astype(cache_kv[1].dtype), index, axis=2)
    else:
        k_all, v_all = k, v
    x = x + attention(q, k_all.astype(q.dtype), v_all.astype(q.dtype), mask, attn_chunk) @ w["o_proj"]
    h = rms_norm(x, w["post_norm"], c.rms_norm_eps)
    x = x + (jax.nn.silu(h @ w["gate_proj"]) * (h @ w["up_proj"])) @ w["down_proj"]
    return x, (k, v)


class Qwen3(nnx.Module):
    """Qwen3ForCausalLM. Call: `logits = model(input_ids, attention_mask=mask)` -> [B, T, V].

    Args:
      config: a `Qwen3Config` (presets in presets.py).
      dtype: compute dtype (activations, matmuls); norms and softmax accumulate in fp32.
      param_dtype: storage dtype of the weights.
      remat: "none", "full" or "dots" (what the backward pass may keep), see REMAT_POLICIES.
      attn_chunk: query block size of memory-efficient attention for long sequences (0: off;
        used when the length is a multiple of it), see `attention`.
    """

    def __init__(self, config: Qwen3Config, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 remat: str = "none", attn_chunk: int = 0, rngs: nnx.Rngs | None = None):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat: {remat!r} is not one of {sorted(REMAT_POLICIES)}")
        self.config, self.dtype, self.remat, self.attn_chunk = config, dtype, remat, attn_chunk
        rngs = rngs or nnx.Rngs(0)
        c, n = config, config.num_hidden_layers
        init = jax.nn.initializers.normal(0.02)
        self.embed = nnx.Param(init(rngs.params(), (c.vocab_size, c.hidden_size), param_dtype))
        self.layers = nnx.Dict({
            name: nnx.Param(jnp.ones((n,) + shape(c), param_dtype) if name in NORMS
                            else init(rngs.params(), (n,) + shape(c), param_dtype))
            for name, (shape, _) in LAYER_WEIGHTS.items()})
        self.final_norm = nnx.Param(jnp.ones((c.hidden_size,), param_dtype))
        self.lm_head = None if c.tie_word_embeddings else nnx.Param(
            init(rngs.params(), (c.hidden_size, c.vocab_size), param_dtype))

    def init_cache(self, batch: int, length: int, dtype=None) -> KVCache:
        """An empty cache for `batch` rows of up to `length` tokens (prompt + new)."""
        c = self.config
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, length, c.head_dim)
        dtype = dtype or self.dtype
        return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                       valid=jnp.zeros((batch, length), bool), next_pos=jnp.zeros((batch,), jnp.int32),
                       index=jnp.int32(0))

    def hidden(self, input_ids, attention_mask=None, cache: KVCache | None = None):
        """Final hidden states [B, T, D] (and the updated cache when one is given)."""
        c = self.config
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        if cache is None:
            positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
            causal = jnp.tril(jnp.ones((t, t), bool))
            attn_mask = causal[None] & mask[:, None, :]
        else:
            positions = cache.next_pos[:, None] + jnp.cumsum(mask, axis=1) - 1
            positions = jnp.maximum(positions, 0)
            slots = jnp.arange(cache.valid.shape[1])
            valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, mask, cache.index, axis=1)
            query_slot = cache.index + jnp.arange(t)
            attn_mask = valid[:, None, :] & (slots[None, None, :] <= query_slot[None, :, None])
        cos, sin = rope(positions, c.head_dim, c.rope_theta)
        x = self.embed.value[input_ids].astype(self.dtype)
        weights = {k: p.value.astype(self.dtype) if k not in NORMS else p.value
                   for k, p in self.layers.items()}
        index = None if cache is None else cache.index

        def body(carry, w):
            x, kv, layer = carry
            if kv is None:
                x, _ = _layer(c, x, w, cos, sin, attn_mask, attn_chunk=self.attn_chunk)
                return (x, kv, layer + 1), None
            # The cache is a carry: each layer writes only this step's slots, in place.
            x, (k, v) = _layer(c, x, w, cos, sin, attn_mask, (kv[0][layer], kv[1][layer]), index)
            start = (layer, 0, 0, index, 0)
            kv = (jax.lax.dynamic_update_slice(kv[0], k[None].astype(kv[0].dtype), start),
                  jax.lax.dynamic_update_slice(kv[1], v[None].astype(kv[1].dtype), start))
            return (x, kv, layer + 1), None

        policy = REMAT_POLICIES[self.remat]
        if policy is not None:
            body = jax.checkpoint(body, policy=policy)
        kv = None if cache is None else (cache.k, cache.v)
        (x, new_kv, _), _ = jax.lax.scan(body, (x, kv, jnp.int32(0)), weights)
        x = rms_norm(x, self.final_norm.value, c.rms_norm_eps)
        if cache is None:
            return x
        new = KVCache(k=new_kv[0], v=new_kv[1], valid=valid,
                      next_pos=cache.next_pos + jnp.sum(mask, axis=1).astype(jnp.int32),
                      index=cache.index + t)
        return x, new

    def logits_from_hidden(self, h):
        """[..., D] -> [..., V] logits in fp32."""
        head = self.embed.value.T if self.lm_head is None else self.lm_head.value
        return jnp.einsum("...d,dv->...v", h, head.astype(self.dtype), preferred_element_type=jnp.float32)

    def token_logprobs(self, h, targets, chunk: int = 256, temperature: float = 1.0,
                       with_entropy: bool = False):
        """log p(targets) from hidden states without materialising [B, T, V] logits.

        h: [B, T, D]; targets: [B, T] int -> [B, T] fp32 (and, with_entropy, the entropy of
        each position's distribution [B, T]). Logits are divided by `temperature`. The sequence
        is cut into chunks of `chunk` tokens; each chunk's logits are recomputed in the backward
        pass (remat), so peak memory holds one [B, chunk, V] block."""
        b, t, d = h.shape
        chunk = min(chunk, t)
        pad = (-t) % chunk
        hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, chunk, d).swapaxes(0, 1)
        tp = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, chunk).swapaxes(0, 1)

        @jax.checkpoint
        def one(args):
            hc, tc = args
            logp = jax.nn.log_softmax(self.logits_from_hidden(hc) / temperature, axis=-1)
            picked = jnp.take_along_axis(logp, tc[..., None], axis=-1)[..., 0]
            if not with_entropy:
                return picked
            return picked, -jnp.sum(jnp.exp(logp) * logp, axis=-1)

        out = jax.lax.map(one, (hp, tp))  # [chunks, B, chunk] (each)
        return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(b, -1)[:, :t], out)

    def __call__(self, input_ids, attention_mask=None, cache: KVCache | None = None):
        """input_ids: [B, T] int; attention_mask: [B, T] (1 = token, 0 = pad).

        Returns logits [B, T, V] fp32, or (logits, cache) when a cache is given: its first call
        is the prefill, later calls append one (or more) tokens per row."""
        out = self.hidden(input_ids, attention_mask, cache)
        if cache is None:
            return self.logits_from_hidden(out)
        return self.logits_from_hidden(out[0]), out[1]


def num_params(config: Qwen3Config) -> int:
    """Parameter count of a config (embeddings counted once when tied)."""
    c = config
    per_layer = sum(math.prod(s(c)) for s, _ in LAYER_WEIGHTS.values())
    head = 0 if c.tie_word_embeddings else c.hidden_size * c.vocab_size
    return c.vocab_size * c.hidden_size + c.num_hidden_layers * per_layer + c.hidden_size + head

