"""Qwen3 (dense) in Flax NNX, exactly as Hugging Face's `Qwen3ForCausalLM` computes it.

RMSNorm (fp32 accumulation), grouped-query attention with per-head q/k RMSNorm before RoPE,
SwiGLU MLP, tied or untied embeddings, `head_dim` independent of hidden / heads. The layers are
stacked (every weight has a leading `[L]` axis) and run under one `jax.lax.scan`, so one layer
body is compiled, with an optional remat policy. Positions come from the attention mask
(cumulative sum), so left padding is harmless. A KV cache serves the sampler: the first call
with it (the prefill) fills it from a prompt, then each call with one token per row appends. The
layers see the cache only through its protocol (models/base.py `Cache`: positions, write,
attend), so the dense `KVCache` here and the paged `PagedKV` (models/paged.py) run the same
code. The cache holds one store per layer; decode steps take per-layer weights
(`unstack_layers`, once per generation) and unroll the layers: a scan would slice (copy) every
layer's weights out of the stack on each step, which costs more than the step's matmuls on CPU.

Shapes: B batch, T tokens, D hidden, H query heads, K kv heads, E head_dim, F intermediate,
V vocab, L layers, S cache length.
"""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from t2t_jax import sharding
from t2t_jax.models import attention as attention_lib
from t2t_jax.models import paged as paged_lib
from t2t_jax.models.base import Cache, Kernels
from t2t_jax.models.paged import PagedKV
from t2t_jax.models.qwen3.presets import Qwen3Config

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Per-layer weights: name -> (shape in terms of the config, logical axes). Matrices are
# [out, in] as in Hugging Face (and the faster operand layout for few-row matmuls on CPU).
LAYER_WEIGHTS = {
    "input_norm": (lambda c: (c.hidden_size,), ("embed",)),
    "q_proj": (lambda c: (c.num_attention_heads * c.head_dim, c.hidden_size), ("q_heads", "embed")),
    "k_proj": (lambda c: (c.num_key_value_heads * c.head_dim, c.hidden_size), ("kv_heads", "embed")),
    "v_proj": (lambda c: (c.num_key_value_heads * c.head_dim, c.hidden_size), ("kv_heads", "embed")),
    "o_proj": (lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim), ("embed", "q_heads")),
    "q_norm": (lambda c: (c.head_dim,), ("head_dim",)),
    "k_norm": (lambda c: (c.head_dim,), ("head_dim",)),
    "post_norm": (lambda c: (c.hidden_size,), ("embed",)),
    "gate_proj": (lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed")),
    "up_proj": (lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed")),
    "down_proj": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
}
GLOBAL_AXES = {"embed": ("vocab", "embed"), "final_norm": ("embed",), "lm_head": ("vocab", "embed")}
NORMS = ("input_norm", "q_norm", "k_norm", "post_norm")
CACHE_AXES = ("batch", "kv_heads", None, None)  # a dense cache's k, v [B, KV, T, D]; valid [B, T]: [::2]


@chex.dataclass
class KVCache:
    """k, v: tuples of L arrays [B, K, S, E] (one per layer, each updated in place); valid:
    [B, S] bool (filled, non-pad slots); next_pos: [B] int32 position of the next token per
    row; index: [] int32 next slot shared by all rows, or [B] one per row (the continuous-
    batching engine's slots, each at its own point).

    The dense layout of the cache protocol (models/base.py `SlotCache`): a call's T tokens go to
    slots index..index + T - 1 of every row, pads included (not valid)."""

    k: chex.Array
    v: chex.Array
    valid: chex.Array
    next_pos: chex.Array
    index: chex.Array

    def map_rows(self, fn) -> KVCache:
        """`fn` applied to every per-row array ([B, ...] -> [B', ...]); a shared index kept."""
        return KVCache(
            k=tuple(map(fn, self.k)),
            v=tuple(map(fn, self.v)),
            valid=fn(self.valid),
            next_pos=fn(self.next_pos),
            index=self.index if self.index.ndim == 0 else fn(self.index),
        )

    def positions(self, mask):
        """mask [B, T] -> [B, T]: the real tokens count on from each row's next position."""
        return jnp.maximum(self.next_pos[:, None] + jnp.cumsum(mask, axis=1) - 1, 0)

    def write(self, store, k, v, mask, kernels):
        """k, v [B, K, T, E] into one layer's [B, K, S, E] arrays at slot `index`."""
        return write_at(store[0], k, self.index, axis=2), write_at(store[1], v, self.index, axis=2)

    def attend(self, store, q, mask, kernels):
        """q [B, H, T, E] over the valid slots up to each query's own (query i of row b sits in
        slot index (+ i)), by the model's dense kernel."""
        valid = write_at(self.valid, mask, self.index, axis=1)
        query_slot = jnp.reshape(self.index, (-1, 1)) + jnp.arange(mask.shape[1])  # [1 or B, T]
        scope = valid[:, None, :] & (jnp.arange(self.valid.shape[1]) <= query_slot[..., None])
        return kernels.dense(q, store[0].astype(q.dtype), store[1].astype(q.dtype), scope, None)

    def advance(self, stores, mask) -> KVCache:
        """The written arrays; this call's real tokens valid, positions and index moved on."""
        k, v = zip(*stores)
        return KVCache(
            k=tuple(k),
            v=tuple(v),
            valid=write_at(self.valid, mask, self.index, axis=1),
            next_pos=self.next_pos + jnp.sum(mask, axis=1).astype(jnp.int32),
            index=self.index + mask.shape[1],
        )

    def columns(self) -> int:
        """Token slots per row (S)."""
        return self.valid.shape[1]

    def with_table(self, table) -> KVCache:
        """(Rows are slots: no table.)"""
        return self

    def admit(self, prefill: KVCache, src, dst) -> KVCache:
        """Rows src [S] of `prefill` (P slots) into rows dst [S] (S: no-op), slots 0..P-1, each
        row's index at P (an index per row)."""
        p = prefill.valid.shape[1]
        put = lambda buf, x: buf.at[dst, :, :p].set(x[src], mode="drop")  # noqa: E731  ([S, K, L, E] <- [G, K, P, E])
        return self.replace(
            k=tuple(map(put, self.k, prefill.k)),
            v=tuple(map(put, self.v, prefill.v)),
            valid=self.valid.at[dst].set(False, mode="drop").at[dst, :p].set(prefill.valid[src], mode="drop"),
            next_pos=self.next_pos.at[dst].set(prefill.next_pos[src], mode="drop"),
            index=self.index.at[dst].set(p, mode="drop"),
        )

    def take(self, idx, window: int) -> KVCache:
        """Rows idx [R] (an index per row), their first `window` slots."""
        cut = lambda x: x[idx, :, :window]  # noqa: E731
        return KVCache(
            k=tuple(map(cut, self.k)),
            v=tuple(map(cut, self.v)),
            valid=self.valid[idx, :window],
            next_pos=self.next_pos[idx],
            index=self.index[idx],
        )

    def put(self, sub: KVCache, idx, window: int) -> KVCache:
        """`take`'s inverse: `sub` written back into rows idx."""
        put = lambda f, x: f.at[idx, :, :window].set(x)  # noqa: E731
        return KVCache(
            k=tuple(map(put, self.k, sub.k)),
            v=tuple(map(put, self.v, sub.v)),
            valid=self.valid.at[idx, :window].set(sub.valid),
            next_pos=self.next_pos.at[idx].set(sub.next_pos),
            index=self.index.at[idx].set(sub.index),
        )


def write_at(buf, x, index, axis: int):
    """`x` into `buf` at `index` along `axis`: one index for all rows ([]), or one per row ([B])."""
    if jnp.ndim(index) == 0:
        return jax.lax.dynamic_update_slice_in_dim(buf, x, index, axis=axis)
    return jax.vmap(lambda b, y, i: jax.lax.dynamic_update_slice_in_dim(b, y, i, axis=axis - 1))(buf, x, index)


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense(x, w, out_dtype=None):
    """x: [..., I] times w: [O, I] -> [..., O] (a Linear layer without bias), accumulated and
    returned in `out_dtype` (None: x's dtype).

    The backward pass is written out (`_dense_bwd`): the weight gradient is one 2-D matmul
    `g^T x` over the flattened tokens. Left to autodiff inside the layer scan, XLA:CPU fused the
    elementwise gradient (SiLU's, the residual sum) into a transposed copy of `g` that ran at a
    few hundred MB/s and cost a quarter of the `100m` train step (docs/benchmarks.md)."""
    return jnp.einsum("...i,oi->...o", x, w, preferred_element_type=out_dtype)


def _dense_fwd(x, w, out_dtype):
    return dense(x, w, out_dtype), (x, w)


def _dense_bwd(out_dtype, res, g):
    """g: [..., O] -> (dx [..., I], dw [O, I]) in the dtypes of x and w (fp32 accumulation)."""
    x, w = res
    g = g.astype(x.dtype)
    dx = jnp.einsum("...o,oi->...i", g, w, preferred_element_type=jnp.float32).astype(x.dtype)
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
    dw = jnp.matmul(g2.T, x2, preferred_element_type=jnp.float32).astype(w.dtype)
    return dx, dw


dense.defvjp(_dense_fwd, _dense_bwd)


def _layer(config: Qwen3Config, x, w, cos, sin, store, mix):
    """One decoder layer. x: [B, T, D]; w: this layer's weights; cos, sin: [B, T, E] RoPE;
    store: this layer's cache store (None without a cache); `mix(q [B, H, T, E], k, v [B, K, T,
    E], store) -> (out [B, T, H * E], store)`: the attention (through the cache, whatever its
    layout, when there is one). Returns (x, store)."""
    c = config
    b, t, _ = x.shape
    h = rms_norm(x, w["input_norm"], c.rms_norm_eps)
    q = dense(h, w["q_proj"]).reshape(b, t, c.num_attention_heads, c.head_dim)
    k = dense(h, w["k_proj"]).reshape(b, t, c.num_key_value_heads, c.head_dim)
    v = dense(h, w["v_proj"]).reshape(b, t, c.num_key_value_heads, c.head_dim)
    q = rms_norm(q, w["q_norm"], c.rms_norm_eps).transpose(0, 2, 1, 3)
    k = rms_norm(k, w["k_norm"], c.rms_norm_eps).transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out, store = mix(q, k, v, store)
    return _mlp(c, x + dense(out, w["o_proj"]), w), store


def _mlp(c: Qwen3Config, x, w):
    """The layer's second half: x + SwiGLU(RMSNorm(x))."""
    h = rms_norm(x, w["post_norm"], c.rms_norm_eps)
    return x + dense(jax.nn.silu(dense(h, w["gate_proj"])) * dense(h, w["up_proj"]), w["down_proj"])


class Qwen3(nnx.Module):
    """Qwen3ForCausalLM. Call: `logits = model(input_ids, attention_mask=mask)` -> [B, T, V].

    Args:
      config: a `Qwen3Config` (presets in presets.py).
      dtype: compute dtype (activations, matmuls); norms and softmax accumulate in fp32.
      param_dtype: storage dtype of the weights.
      remat: "none", "full" or "dots" (what the backward pass may keep), see REMAT_POLICIES.
      attention: the attention kernel (models/attention.py KERNELS: auto, xla, chunked,
        splash, cudnn; `auto` resolved for the platform at build time).
      attn_chunk: query block size of the `chunked` kernel (with `auto` on CPU: chunked when > 0).
      mesh: the mesh the model is sharded on (the splash kernel runs in shard_map over it).
      scan_layers: run the layers under one `lax.scan` (one compiled layer body: compile time
        independent of depth, the pod-scale setting); False unrolls them (L copies of the body,
        no stacked activation buffers; on CPU faster for some shapes and slower for others,
        docs/benchmarks.md), as MaxText's `scan_layers`.
    """

    def __init__(
        self,
        config: Qwen3Config,
        *,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        remat: str = "none",
        attention: str = "auto",
        attn_chunk: int = 0,
        scan_layers: bool = True,
        mesh=None,
        rngs: nnx.Rngs | None = None,
    ):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat: {remat!r} is not one of {sorted(REMAT_POLICIES)}")
        self.config, self.dtype, self.remat, self.attn_chunk = config, dtype, remat, attn_chunk
        self.attention = attention_lib.resolve(attention, attn_chunk, attention_lib.platform_of(mesh))
        self.mesh = mesh
        self.scan_layers = scan_layers
        rngs = rngs or nnx.Rngs(0)
        c, n = config, config.num_hidden_layers
        init = jax.nn.initializers.normal(0.02)
        self.embed = nnx.Param(init(rngs.params(), (c.vocab_size, c.hidden_size), param_dtype))
        self.layers = nnx.Dict(
            {
                name: nnx.Param(
                    jnp.ones((n,) + shape(c), param_dtype)
                    if name in NORMS
                    else init(rngs.params(), (n,) + shape(c), param_dtype)
                )
                for name, (shape, _) in LAYER_WEIGHTS.items()
            }
        )
        self.final_norm = nnx.Param(jnp.ones((c.hidden_size,), param_dtype))
        self.lm_head = (
            None
            if c.tie_word_embeddings
            else nnx.Param(init(rngs.params(), (c.vocab_size, c.hidden_size), param_dtype))
        )

    @property
    def paged_kernel(self) -> str:
        """The decode kernel of a paged cache (models/paged.py): the Pallas one with splash
        (the TPU kernels, interpret mode off TPU) where the head size suits its TPU tiling (on
        TPU a multiple of 128: every Qwen3 preset but `tiny`), else the gathered dense one."""
        tiles = self.config.head_dim % 128 == 0 or attention_lib.platform_of(self.mesh) != "tpu"
        return "paged" if self.attention == "splash" and tiles else "gather"

    def attend(self, q, k, v, mask, pad=None, chunk: int = 0):
        """This model's attention kernel (models/attention.py `attend`)."""
        return attention_lib.attend(self.attention, q, k, v, mask, pad, chunk, self.mesh)

    @property
    def kernels(self) -> Kernels:
        """The attention kernels a cache layout attends with (models/base.py `Kernels`)."""
        return Kernels(
            dense=functools.partial(self.attend, chunk=self.attn_chunk), paged=self.paged_kernel, mesh=self.mesh
        )

    @staticmethod
    def logical_axes(name: str) -> tuple:
        """Logical axes of one weight (t2t_jax.sharding maps them to mesh axes); layer weights
        have a leading `layers` axis."""
        if name in LAYER_WEIGHTS:
            return ("layers",) + LAYER_WEIGHTS[name][1]
        return GLOBAL_AXES[name]

    def named_params(self) -> dict:
        """Our weight name -> its nnx.Param (layer weights stacked [L, ...])."""
        return named_params(self)

    def init_cache(self, batch: int, length: int, dtype=None) -> KVCache:
        """An empty cache for `batch` rows of up to `length` tokens (prompt + new); under a mesh,
        placed as the activations are (rows over the data axes, KV heads over `tensor`), so each
        device holds its share of k and v [batch, kv_heads, length, head_dim], not all of it."""
        c = self.config
        shape = (batch, c.num_key_value_heads, length, c.head_dim)
        dtype = dtype or self.dtype

        def zeros():
            return tuple(self._placed(jnp.zeros(shape, dtype), CACHE_AXES) for _ in range(c.num_hidden_layers))

        return KVCache(
            k=zeros(),
            v=zeros(),
            valid=self._placed(jnp.zeros((batch, length), bool), CACHE_AXES[::2]),
            next_pos=self._placed(jnp.zeros((batch,), jnp.int32), CACHE_AXES[:1]),
            index=jnp.int32(0),
        )

    def _placed(self, x, axes: tuple):
        """`x` with a sharding constraint of logical `axes` on the model's mesh (as is on one device)."""
        if self.mesh is None or self.mesh.size == 1:
            return x
        return jax.lax.with_sharding_constraint(x, sharding.param_sharding(axes, x.shape, self.mesh))

    def init_paged_cache(self, slots: int, pages: int, page_size: int, pages_per_slot: int, dtype=None) -> PagedKV:
        """An empty paged cache (models/paged.py): `pages` pages of `page_size` tokens per layer
        shared by `slots` slots of up to `pages_per_slot` pages each."""
        c = self.config
        return paged_lib.empty(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            slots=slots,
            pages=pages,
            page_size=page_size,
            pages_per_slot=pages_per_slot,
            dtype=dtype or self.dtype,
            mesh=self.mesh,
        )

    def stacked_layers(self) -> dict:
        """{name: [L, ...]} layer weights in the compute dtype (norms as stored)."""
        return {k: p.value.astype(self.dtype) if k not in NORMS else p.value for k, p in self.layers.items()}

    def unstack_layers(self) -> tuple:
        """L dicts of one layer's weights. The sampler unstacks once before its decode loop
        and passes them to every step (`layers=`), so no step copies weights (they are a
        second copy of the layer weights while the sampler runs)."""
        stacked = self.stacked_layers()
        return tuple({k: w[i] for k, w in stacked.items()} for i in range(self.config.num_hidden_layers))

    def hidden(self, input_ids, attention_mask=None, cache: Cache | None = None, layers=None, prefill=False):
        """Final hidden states [B, T, D] (and the updated cache when one is given).

        The cache is any layout of the protocol (models/base.py `Cache`: dense `KVCache`, paged
        `PagedKV`): it places the tokens, and each layer writes to and attends over it.
        `prefill=True` says the cache is empty (the sampler's first call): with a flash kernel
        (splash, cuDNN) attention then runs within the prompt (no [T, S] scores over the whole
        cache), its keys and values written to the cache; the dense kernels attend over the
        cache as a decode step does (CPU numbers stay as they were).

        Without `layers` the stacked weights run under one scan (the cache's per-layer stores
        are stacked alongside for the call: fine for a prefill), or unrolled when the model was
        built with `scan_layers=False`. `layers`, the output of `unstack_layers()` computed once
        by a caller that steps repeatedly, unrolls the layers, each updating its own store in
        place (a decode step)."""
        c = self.config
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        x = self.embed.value[input_ids].astype(self.dtype)
        within = cache is None or (prefill and self.attention in attention_lib.FLASH)  # (self-attention)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0) if cache is None else cache.positions(mask)
        cos, sin = rope(positions, c.head_dim, c.rope_theta)
        causal = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :] if within else None
        kernels = self.kernels

        def mix(q, k, v, store):
            if cache is not None:
                k, v = k.astype(cache.k[0].dtype), v.astype(cache.v[0].dtype)  # (as a decode step will read them)
                store = cache.write(store, k, v, mask, kernels)
            if within:
                return kernels.dense(q, k.astype(q.dtype), v.astype(q.dtype), causal, mask), store
            return cache.attend(store, q, mask, kernels), store

        stores = (None,) * c.num_hidden_layers if cache is None else tuple(zip(cache.k, cache.v))
        policy = REMAT_POLICIES[self.remat]
        if layers is None and not self.scan_layers:
            layers = self.unstack_layers()
        if layers is not None:
            layer = functools.partial(_layer, c, mix=mix)
            if policy is not None and cache is None:  # (decode steps are never differentiated)
                layer = jax.checkpoint(layer, policy=policy)
            stores = list(stores)
            for i, w in enumerate(layers):
                x, stores[i] = layer(x, w, cos, sin, stores[i])
        else:

            def body(x, xs):
                w, store = xs
                return _layer(c, x, w, cos, sin, store, mix)

            if policy is not None:
                body = jax.checkpoint(body, policy=policy)
            stacked = None if cache is None else jax.tree.map(lambda *a: jnp.stack(a), *stores)
            x, ys = jax.lax.scan(body, x, (self.stacked_layers(), stacked))
            stores = None if cache is None else tuple(zip(*ys))
        x = rms_norm(x, self.final_norm.value, c.rms_norm_eps)
        return x if cache is None else (x, cache.advance(stores, mask))

    def logits_from_hidden(self, h):
        """[..., D] -> [..., V] logits in fp32."""
        head = self.embed.value if self.lm_head is None else self.lm_head.value
        return dense(h, head.astype(self.dtype), jnp.float32)

    def token_logprobs(self, h, targets, chunk: int = 256, temperature: float = 1.0, with_entropy: bool = False):
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

    def __call__(self, input_ids, attention_mask=None, cache: Cache | None = None, layers=None, prefill=False):
        """input_ids: [B, T] int; attention_mask: [B, T] (1 = token, 0 = pad).

        Returns logits [B, T, V] fp32, or (logits, cache) when a cache is given: its first call
        is the prefill, later calls append one (or more) tokens per row (`layers`, `prefill`:
        see `hidden`)."""
        out = self.hidden(input_ids, attention_mask, cache, layers, prefill)
        if cache is None:
            return self.logits_from_hidden(out)
        return self.logits_from_hidden(out[0]), out[1]


def named_params(model) -> dict:
    """Weight name -> its leaf, for a Qwen3 or a pytree of its shape (e.g. its gradients)."""
    out = {"embed": model.embed, "final_norm": model.final_norm}
    if getattr(model, "lm_head", None) is not None:
        out["lm_head"] = model.lm_head
    out.update(dict(model.layers.items()))
    return out


def num_params(config: Qwen3Config) -> int:
    """Parameter count of a config (embeddings counted once when tied)."""
    c = config
    per_layer = sum(math.prod(s(c)) for s, _ in LAYER_WEIGHTS.values())
    head = 0 if c.tie_word_embeddings else c.hidden_size * c.vocab_size
    return c.vocab_size * c.hidden_size + c.num_hidden_layers * per_layer + c.hidden_size + head
