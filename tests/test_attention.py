"""Attention kernels (t2t_jax/models/attention.py): splash (Pallas interpret mode on CPU), the
dot_product_attention path of `cudnn` (XLA's implementation here: cuDNN itself needs a GPU) and
the chunked kernel give the reference's outputs and gradients on left-padded GQA batches, for
lengths that do and do not divide the blocks; a whole Qwen3 with each kernel gives the same
logits and parameter gradients; splash under a 4-device mesh runs in shard_map."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t_jax.config import defaults, schema
from t2t_jax.models import attention, qwen3


def batch(t, b=2, h=4, kv=2, e=64, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (b, h, t, e))
    k, v = (jax.random.normal(x, (b, kv, t, e)) for x in ks[1:])
    lengths = np.array([t, t - 37])[:b]
    pad = jnp.arange(t)[None] >= (t - lengths)[:, None]  # left padding
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & pad[:, None, :]
    return q, k, v, mask, pad


KERNELS = {
    "splash": lambda q, k, v, mask, pad: attention.splash(q, k, v, pad, block=128),
    "dot_product_attention": lambda q, k, v, mask, pad: attention.cudnn(q, k, v, mask, implementation=None),
    "chunked": lambda q, k, v, mask, pad: attention.dense(q, k, v, mask, chunk=64),
}


@pytest.mark.parametrize("t", [200, 256])  # 200: padded to two blocks of 128; 256: exactly two
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernels_match_the_reference_with_gradients(kernel, t):
    q, k, v, mask, pad = batch(t)
    real = pad[:, :, None]

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v, mask, pad), 0.0) ** 2)

    ref = attention.dense(q, k, v, mask)
    got = KERNELS[kernel](q, k, v, mask, pad)
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, ref, 0), atol=2e-5)
    g_ref = jax.grad(loss(lambda q, k, v, m, p: attention.dense(q, k, v, m)), argnums=(0, 1, 2))(q, k, v)
    g_got = jax.grad(loss(KERNELS[kernel]), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_got, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_auto_picks_by_platform_and_bad_names_are_refused():
    assert attention.resolve("auto", platform="tpu") == "splash"
    assert attention.resolve("auto", platform="gpu") == "cudnn"
    assert attention.resolve("auto", 0, platform="cpu") == "xla"
    assert attention.resolve("auto", 512, platform="cpu") == "chunked"
    assert attention.resolve("splash", platform="cpu") == "splash"
    with pytest.raises(ValueError, match="model.attention: 'flash'"):
        attention.resolve("flash")
    config = defaults.base()
    config.model.attention = "flash"
    with pytest.raises(schema.ConfigError, match="model.attention: 'flash' is not one of"):
        schema.validate(config)


# splash in Pallas interpret mode: a minute of tracing on the CPU, so slow (its kernel-level check
# against the reference, test_kernels_match_the_reference_with_gradients, stays in the default run).
@pytest.mark.parametrize("kind", [pytest.param("splash", marks=pytest.mark.slow), "chunked"])
def test_qwen3_logits_and_gradients_equal_across_kernels(kind):
    """The tiny Qwen3 on a left-padded batch: the same logits at the real tokens and the same
    parameter gradients of a masked loss as the reference kernel."""
    ids = jax.random.randint(jax.random.key(1), (2, 150), 0, 1000)
    mask = jnp.arange(150)[None] >= jnp.array([0, 40])[:, None]
    models = {
        a: qwen3.Qwen3(qwen3.PRESETS["tiny"], attention=a, attn_chunk=64, rngs=nnx.Rngs(0)) for a in ("xla", kind)
    }

    def loss(model):
        logits = model(ids, attention_mask=mask)
        return jnp.sum(jnp.where(mask[:, :, None], jax.nn.log_softmax(logits), 0.0)) / 1e4, logits

    out = {a: nnx.value_and_grad(loss, has_aux=True)(m) for a, m in models.items()}
    (_, ref), g_ref = out["xla"]
    (_, got), g_got = out[kind]
    np.testing.assert_allclose(np.where(mask[:, :, None], got, 0), np.where(mask[:, :, None], ref, 0), atol=1e-4)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-3)


@pytest.mark.parametrize("kind", [pytest.param("splash", marks=pytest.mark.slow), "dot_product_attention"])
def test_a_flash_prefill_fills_the_cache_as_the_dense_one(kind):
    """The sampler's prefill through a flash kernel (attention within the prompt, not over the
    cache's slots) leaves the same cache and last-position hidden states as the reference, so
    the greedy completions are the same tokens."""
    from t2t_jax.sampling.sampler import Sampler

    ids = jax.random.randint(jax.random.key(2), (3, 70), 0, 1000)
    mask = jnp.arange(70)[None] >= jnp.array([0, 9, 50])[:, None]
    models = {a: qwen3.Qwen3(qwen3.PRESETS["tiny"], attention=a, rngs=nnx.Rngs(0)) for a in ("xla", "splash", "cudnn")}
    flash = models["splash" if kind == "splash" else "cudnn"]
    if kind == "dot_product_attention":  # (XLA's implementation of the cudnn path: no GPU here)
        flash.attend = lambda q, k, v, m, pad=None, chunk=0: (
            attention.cudnn(q, k, v, m, implementation=None) if pad is not None else attention.dense(q, k, v, m)
        )
    (h_ref, c_ref), (h_got, c_got) = (
        m.hidden(ids, mask, cache=m.init_cache(3, 100), prefill=True) for m in (models["xla"], flash)
    )
    np.testing.assert_allclose(h_got[:, -1], h_ref[:, -1], atol=1e-4)
    for a, b in zip(c_got.k + c_got.v, c_ref.k + c_ref.v):
        np.testing.assert_allclose(
            np.where(c_ref.valid[:, None, :, None], a, 0), np.where(c_ref.valid[:, None, :, None], b, 0), atol=1e-4
        )
    assert (c_got.valid == c_ref.valid).all() and int(c_got.index) == 70
    if kind == "splash":
        ref, got = (
            Sampler(m, stop_ids=[], pad_id=0).generate(ids, mask, max_new_tokens=12) for m in (models["xla"], flash)
        )
        np.testing.assert_array_equal(got.tokens, ref.tokens)


SHARDED = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from t2t_jax.models import attention
from t2t_jax.sharding import make_mesh
mesh = make_mesh({"data": 2, "fsdp": 1, "tensor": 2})
ks = jax.random.split(jax.random.key(0), 3)
q = jax.random.normal(ks[0], (2, 4, 130, 64))
k, v = (jax.random.normal(x, (2, 2, 130, 64)) for x in ks[1:])
pad = jnp.arange(130)[None] >= jnp.array([0, 30])[:, None]
mask = jnp.tril(jnp.ones((130, 130), bool))[None] & pad[:, None, :]
run = jax.jit(lambda q, k, v, pad: attention.splash(q, k, v, pad, mesh=mesh, block=128))
text = run.lower(q, k, v, pad).as_text()
assert "shard_map" in text or "sdy.manual_computation" in text or "custom_call" in text, text[:2000]
got, ref = run(q, k, v, pad), attention.dense(q, k, v, mask)
err = float(jnp.max(jnp.abs(jnp.where(pad[:, :, None], got - ref, 0))))
assert err < 2e-5, err
print("ok", err)
"""


def test_splash_runs_sharded_over_batch_and_kv_heads():
    out = subprocess.run(
        [sys.executable, "-c", SHARDED],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
