"""Attention kernels, chosen by `model.attention` (`KERNELS`), behind one signature:

    out = attend(kind, q, k, v, mask, pad, chunk=512, mesh=mesh)    # -> [B, T, H * E]

q: [B, H, T, E]; k, v: [B, K, S, E] (grouped-query: each kv head serves H / K query heads);
`mask` [B, T, S] bool, the full mask (causal, left padding, a cache's valid slots); `pad`
[B, T] bool, the real tokens of a self-attention call (no cache, or a flash kernel's prefill
into an empty cache; None inside a decode step: the dense kernels run there). Softmax in fp32;
q/k norms and RoPE happen before.

- `xla`: scores in full, [B, H, T, S] (the reference).
- `chunked`: queries in blocks of `chunk` under `lax.map`, each block rematerialised in the
  backward pass (peak [B, H, chunk, S]); pure JAX, the CPU choice for long sequences.
- `splash`: Pallas splash attention (jax.experimental.pallas.ops.tpu.splash_attention), the MQA
  kernel vmapped over batch and kv heads, causal with segment ids from `pad` (left padding is
  segment 0, so a real query sees only real keys), T padded up to a multiple of the block.
  Under a mesh it runs in `shard_map` over batch and kv heads (the mesh axes of the `batch` and
  `kv_heads` rules), as MaxText does. On other platforms than TPU it runs in Pallas interpret
  mode (how the tests check it on CPU: slow, exact).
- `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")`, GQA native, the mask given
  as is (cuDNN's flash kernel on NVIDIA GPUs; only there).
- `auto`: splash on TPU, cudnn on GPU, elsewhere chunked when `chunk` > 0, else xla (`resolve`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

KERNELS = ("auto", "xla", "chunked", "splash", "cudnn")
FLASH = ("splash", "cudnn")  # the kernels of self-attention calls (no cache, or a prefill into an empty one)
SPLASH_BLOCK = 512  # the largest splash block; short sequences use one block of their padded length


def platform_of(mesh=None) -> str:
    """The platform of the mesh's devices (no mesh: JAX's default backend)."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def resolve(kind: str, chunk: int = 0, platform: str | None = None) -> str:
    """`auto` -> the kernel for `platform` (default: JAX's backend); others unchanged."""
    if kind not in KERNELS:
        raise ValueError(f"model.attention: {kind!r} is not one of {KERNELS}")
    if kind != "auto":
        return kind
    platform = platform or jax.default_backend()
    return {"tpu": "splash", "gpu": "cudnn"}.get(platform, "chunked" if chunk else "xla")


def _scores_attend(q, k, v, mask):
    """q: [B, K, G, T, E]; k, v: [B, K, S, E]; mask: [B, T, S] -> [B, K, G, T, E]."""
    scores = jnp.einsum("bkgte,bkse->bkgts", q, k, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bkse->bkgte", probs, v)


def _merge_heads(out):
    """[B, H, T, E] -> [B, T, H * E]."""
    b, h, t, e = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, t, h * e)


def dense(q, k, v, mask, chunk: int = 0):
    """The `xla` kernel, or `chunked` when chunk > 0 and T > chunk (see the module docstring)."""
    b, h, t, e = q.shape
    kv, g = k.shape[1], h // k.shape[1]
    q = q.reshape(b, kv, g, t, e)
    if chunk and t > chunk:
        pad, n = -t % chunk, -(-t // chunk)
        qc = jnp.pad(q, ((0, 0),) * 3 + ((0, pad), (0, 0))).reshape(b, kv, g, n, chunk, e)
        mc = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, -1)
        block = jax.checkpoint(lambda args: _scores_attend(args[0], k, v, args[1]))
        out = jax.lax.map(block, (qc.transpose(3, 0, 1, 2, 4, 5), mc.transpose(1, 0, 2, 3)))
        out = out.transpose(1, 2, 3, 0, 4, 5).reshape(b, kv, g, n * chunk, e)[:, :, :, :t]
    else:
        out = _scores_attend(q, k, v, mask)
    return _merge_heads(out.reshape(b, h, t, e))


def cudnn(q, k, v, mask, implementation: str | None = "cudnn"):
    """The `cudnn` kernel (implementation None: XLA's own, the same maths on any platform)."""
    out = jax.nn.dot_product_attention(
        q.transpose(0, 2, 1, 3),
        k.transpose(0, 2, 1, 3),
        v.transpose(0, 2, 1, 3),
        mask=mask[:, None],
        implementation=implementation,
    )
    b, t, h, e = out.shape
    return out.reshape(b, t, h * e)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@functools.lru_cache(maxsize=64)
def _splash_kernel(length: int, group: int, block: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((length, length))] * group)
    sizes = sa.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    with jax.ensure_compile_time_eval():  # (its mask tables are constants, whichever trace asks first)
        return sa.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash(q, k, v, pad, mesh=None, block: int = SPLASH_BLOCK, interpret: bool | None = None):
    """The `splash` kernel: causal self-attention, q: [B, H, T, E]; k, v: [B, K, T, E]; pad:
    [B, T] bool -> [B, T, H * E] (positions where pad is False are garbage: masked downstream)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, h, t, e = q.shape
    kv, g = k.shape[1], h // k.shape[1]
    block = min(block, _round_up(t, 128))
    tp = _round_up(t, block)
    if interpret is None:  # (the mesh's chips decide: an ahead-of-time compile for TPU from a CPU host)
        interpret = platform_of(mesh) != "tpu"
    kernel = _splash_kernel(tp, g, block, interpret)
    extra = ((0, 0), (0, 0), (0, tp - t), (0, 0))
    qp = jnp.pad(q * jnp.asarray(e**-0.5, q.dtype), extra).reshape(b, kv, g, tp, e)
    kp, vp = jnp.pad(k, extra), jnp.pad(v, extra)
    seg = jnp.pad(pad.astype(jnp.int32), ((0, 0), (0, tp - t)))

    def heads(q1, k1, v1, s1):  # one sequence: q1 [K, G, T, E], k1 / v1 [K, T, E], s1 [T]
        one = lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=sa.SegmentIds(q=s1, kv=s1))  # noqa: E731
        return jax.vmap(one)(q1, k1, v1)

    run = jax.vmap(heads)
    if mesh is not None and mesh.size > 1:
        from jax.sharding import PartitionSpec as P

        from t2t_jax import sharding

        q_spec = sharding.spec(("batch", "kv_heads", None, None, None), qp.shape, mesh)
        kv_spec = P(*q_spec[:2], None, None)
        run = jax.shard_map(
            run, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, P(q_spec[0], None)), out_specs=q_spec, check_vma=False
        )
    out = run(qp, kp, vp, seg)
    return _merge_heads(out[:, :, :, :t].reshape(b, h, t, e))


def attend(kind: str, q, k, v, mask, pad=None, chunk: int = 0, mesh=None):
    """Attention by kernel `kind` (resolved: not `auto`); see the module docstring."""
    if kind == "splash" and pad is not None:
        return splash(q, k, v, pad, mesh)
    if kind == "cudnn" and pad is not None:
        return cudnn(q, k, v, mask)
    return dense(q, k, v, mask, chunk if kind == "chunked" else 0)
