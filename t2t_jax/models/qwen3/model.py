"""Qwen3 (dense) in Flax NNX, exactly as Hugging Face's `Qwen3ForCausalLM` computes it.

RMSNorm (fp32 accumulation), grouped-query attention with per-head q/k RMSNorm before RoPE,
SwiGLU MLP, tied or untied embeddings, `head_dim` independent of hidden / heads. The layers are
stacked (every weight has a leading `[L]` axis) and run under one `jax.lax.scan`, so one layer
body is compiled, with an optional remat policy. Positions come from the attention mask
(cumulative sum), so left padding is harmless. A KV cache serves the sampler: the first call
with it (the prefill) fills it from a prompt, then each call with one token per row appends at
`cache.index`. The cache holds one array per layer; decode steps take per-layer weights
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

from t2t_jax.models import attention as attention_lib
from t2t_jax.models import paged as paged_lib
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


@chex.dataclass
class KVCache:
    """k, v: tuples of L arrays [B, K, S, E] (one per layer, each updated in place); valid:
    [B, S] bool (filled, non-pad slots); next_pos: [B] int32 position of the next token per
    row; index: [] int32 next slot shared by all rows, or [B] one per row (the continuous-
    batching engine's slots, each at its own point)."""

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


def _layer(config: Qwen3Config, x, w, cos, sin, mask, cache_kv=None, index=None, attn=None, pad=None, mix=None):
    """One decoder layer. x: [B, T, D]; w: this layer's weights; cache_kv: this layer's cached
    ([B, K, S, E] x 2), with this step's keys/values written at slot `index`. With `pad` [B, T]
    (x's real tokens) attention runs within x only, `mask` [B, T, T] (no cache, or a prefill into
    an empty one); without, over the cache's S slots, `mask` [B, T, S]. `attn(q, k, v, mask,
    pad)`: the attention kernel (models/attention.py; None: the dense one). `mix(q, k, v) ->
    (out [B, T, H * E], cache arrays)` replaces the cache write and attention (a paged cache).
    Returns (x, (k, v)): the updated cache arrays, or without a cache this step's keys and values
    [B, K, T, E]."""
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
    if mix is not None:
        out, kv = mix(q, k, v)
        return _mlp(c, x + dense(out, w["o_proj"]), w), kv
    if cache_kv is not None:
        k, v = k.astype(cache_kv[0].dtype), v.astype(cache_kv[1].dtype)  # (as a decode step will read them)
        k_all, v_all = write_at(cache_kv[0], k, index, axis=2), write_at(cache_kv[1], v, index, axis=2)
    else:
        k_all, v_all = k, v
    keys, values = (k, v) if pad is not None else (k_all, v_all)
    attn = attn or functools.partial(attention_lib.attend, "xla")
    x = x + dense(attn(q, keys.astype(q.dtype), values.astype(q.dtype), mask, pad), w["o_proj"])
    return _mlp(c, x, w), (k_all, v_all)


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
        """An empty cache for `batch` rows of up to `length` tokens (prompt + new)."""
        c = self.config
        shape = (batch, c.num_key_value_heads, length, c.head_dim)
        dtype = dtype or self.dtype
        zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(c.num_hidden_layers))  # noqa: E731
        return KVCache(
            k=zeros(),
            v=zeros(),
            valid=jnp.zeros((batch, length), bool),
            next_pos=jnp.zeros((batch,), jnp.int32),
            index=jnp.int32(0),
        )

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

    def hidden(self, input_ids, attention_mask=None, cache: KVCache | None = None, layers=None, prefill=False):
        """Final hidden states [B, T, D] (and the updated cache when one is given).

        `prefill=True` says the cache is empty (the sampler's first call): with a flash kernel
        (splash, cuDNN) attention then runs within the prompt through it (no [T, S] scores over
        the whole cache), the prompt's keys and values filling slots 0..T-1; the dense kernels
        attend over the cache's slots as a decode step does (CPU numbers stay as they were).

        Without `layers` the stacked weights run under one scan (the cache's per-layer arrays
        are stacked alongside for the call: fine for a prefill), or unrolled when the model was
        built with `scan_layers=False`. `layers`, the output of `unstack_layers()` computed once
        by a caller that steps repeatedly, unrolls the layers, each updating its own cache
        arrays in place (a decode step)."""
        c = self.config
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        x = self.embed.value[input_ids].astype(self.dtype)
        if isinstance(cache, PagedKV):
            return self._paged_step(x, mask, cache, layers)
        within = cache is None or (prefill and self.attention in attention_lib.FLASH)  # (self-attention)
        index = None if cache is None else cache.index
        if within:
            positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
            attn_mask = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]
        else:
            positions = jnp.maximum(cache.next_pos[:, None] + jnp.cumsum(mask, axis=1) - 1, 0)
        if cache is not None:
            valid = write_at(cache.valid, mask, cache.index, axis=1)
        if not within:  # query i of row b sits in slot index (+ i): it sees the valid slots up to its own
            query_slot = jnp.reshape(cache.index, (-1, 1)) + jnp.arange(t)  # [1 or B, T]
            attn_mask = valid[:, None, :] & (jnp.arange(cache.valid.shape[1]) <= query_slot[..., None])
        cos, sin = rope(positions, c.head_dim, c.rope_theta)
        pad = mask if within else None
        attn = functools.partial(self.attend, chunk=self.attn_chunk)
        policy = REMAT_POLICIES[self.remat]
        if layers is None and not self.scan_layers:
            layers = self.unstack_layers()
        if layers is not None:
            layer = functools.partial(_layer, c, attn=attn, pad=pad)
            if policy is not None and cache is None:  # (decode steps are never differentiated)
                layer = jax.checkpoint(layer, policy=policy)
            new_k, new_v = [], []
            for i, w in enumerate(layers):
                layer_kv = None if cache is None else (cache.k[i], cache.v[i])
                x, (k, v) = layer(x, w, cos, sin, attn_mask, layer_kv, index)
                new_k.append(k)
                new_v.append(v)
            kv = (tuple(new_k), tuple(new_v))
        else:

            def body(x, xs):
                w, layer_kv = xs
                x, layer_kv = _layer(c, x, w, cos, sin, attn_mask, layer_kv, index, attn, pad)
                return x, (layer_kv if cache is not None else None)

            if policy is not None:
                body = jax.checkpoint(body, policy=policy)
            stacked_kv = None if cache is None else (jnp.stack(cache.k), jnp.stack(cache.v))
            x, ys = jax.lax.scan(body, x, (self.stacked_layers(), stacked_kv))
            kv = None if cache is None else (tuple(ys[0]), tuple(ys[1]))
        x = rms_norm(x, self.final_norm.value, c.rms_norm_eps)
        if cache is None:
            return x
        return x, KVCache(
            k=kv[0],
            v=kv[1],
            valid=valid,
            next_pos=cache.next_pos + jnp.sum(mask, axis=1).astype(jnp.int32),
            index=cache.index + t,
        )

    def _paged_step(self, x, mask, cache: PagedKV, layers=None):
        """One decode step into a paged cache: x [S, 1, D] embedded tokens, mask [S, 1] the
        active slots (the others write to the null page and keep their length) -> (hidden
        [S, 1, D], cache)."""
        c = self.config
        if x.shape[1] != 1:
            raise ValueError(f"a paged cache takes one token per slot per call (decode steps), got {x.shape[1]}")
        active = mask[:, 0]
        cos, sin = rope(cache.lengths[:, None], c.head_dim, c.rope_theta)  # (slot token j has position j)
        new_k, new_v = [], []
        for i, w in enumerate(layers if layers is not None else self.unstack_layers()):
            mix = functools.partial(self._paged_mix, k_pool=cache.k[i], v_pool=cache.v[i], cache=cache, active=active)
            x, (k, v) = _layer(c, x, w, cos, sin, None, mix=mix)
            new_k.append(k)
            new_v.append(v)
        x = rms_norm(x, self.final_norm.value, c.rms_norm_eps)
        return x, cache.replace(k=tuple(new_k), v=tuple(new_v), lengths=cache.lengths + active.astype(jnp.int32))

    def _paged_mix(self, q, k, v, *, k_pool, v_pool, cache, active):
        out, k_pool, v_pool = paged_lib.decode_attention(
            q, k, v, k_pool, v_pool, cache.table, cache.lengths, active, self.paged_kernel, self.mesh
        )
        return out, (k_pool, v_pool)

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

    def __call__(self, input_ids, attention_mask=None, cache: KVCache | None = None, layers=None, prefill=False):
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
