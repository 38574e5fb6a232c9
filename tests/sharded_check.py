"""Run with 8 fake CPU devices (see test_sharding.py): sharded logits == single-device logits, and
the sampler on sharded params with the batch sharded over the data axes gives the same tokens.

    python tests/sharded_check.py CKPT_DIR                       # 8 fake devices, one process
    python tests/sharded_check.py multihost PORT PID NPROC      # one of NPROC processes (2 fake
                                                                 # devices each) over localhost

The multihost mode (tests/test_engine.py starts it) runs the engine, dense and paged, over a mesh
that spans every process, the prompts given as arrays whose rows split over the processes (what
the engine reads back spans them); each process checks the Sampler's tokens on its own device.
"""

import os
import sys

MULTIHOST = sys.argv[1] == "multihost"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + ("2" if MULTIHOST else "8")

import jax  # noqa: E402

if MULTIHOST:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=int(sys.argv[4]), process_id=int(sys.argv[3]))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from t2t_jax import sharding  # noqa: E402
from t2t_jax.models import qwen3  # noqa: E402
from t2t_jax.sampling import Engine, Sampler  # noqa: E402

PAGED_MESHES = ({"fsdp": 4, "tensor": 2}, {"data": 2, "fsdp": 2, "tensor": 2})
CONFIG = qwen3.Qwen3Config(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=16,
    tie_word_embeddings=False,
)


def sample(model, ids, mask):
    """Greedy and temperature-1 samples (n=2 per prompt) of 6 tokens."""
    sampler = Sampler(model, stop_ids=[95], pad_id=0)
    greedy = sampler.generate(ids, mask, max_new_tokens=6)
    hot = sampler.generate(ids, mask, max_new_tokens=6, temperature=1.0, n=2, seed=3)
    return [np.asarray(x) for x in (greedy.tokens, greedy.logprobs, hot.tokens, hot.logprobs)]


def inputs():
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 96, (8, 10)))
    return ids, jnp.ones((8, 10), bool).at[3, :4].set(False)


def main(path):
    assert len(jax.devices()) == 8
    qwen3.save_pretrained(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), path)
    ids, mask = inputs()
    single_model = qwen3.from_pretrained(path)
    single = np.asarray(single_model(ids, attention_mask=mask))
    single_samples = sample(single_model, ids, mask)
    for axes in (
        {"fsdp": 4, "tensor": 2},
        {"data": 2, "fsdp": 2, "tensor": 2},
        {"fsdp": -1},
        {"tensor": 8},
        {"data": 8},
    ):
        mesh = sharding.make_mesh(axes)
        model = qwen3.from_pretrained(path, mesh=mesh)
        q = model.layers["q_proj"].value
        assert len(q.sharding.device_set) == 8
        if axes.get("fsdp", 1) * axes.get("tensor", 1) > 1:
            assert not q.sharding.is_fully_replicated, axes
        batch = sharding.batch_sharding(mesh)
        out = jax.jit(lambda m, i, a: m(i, attention_mask=a))(
            model, jax.device_put(ids, batch), jax.device_put(mask, batch)
        )
        np.testing.assert_allclose(np.asarray(out), single, atol=2e-5, err_msg=str(axes))
        samples = sample(model, jax.device_put(ids, batch), jax.device_put(mask, batch))
        for got, want in zip(samples[0::2], single_samples[0::2]):
            np.testing.assert_array_equal(got, want, err_msg=f"sampled tokens, {axes}")
        for got, want in zip(samples[1::2], single_samples[1::2]):
            np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"sampled logprobs, {axes}")
        # the dense engine: its cache placed as the activations (rows over the batch axes, kv heads over tensor)
        cache = jax.jit(lambda m: m.init_cache(8, 16))(model)
        k = cache.k[0]
        want = sharding.param_sharding(qwen3.model.CACHE_AXES, k.shape, mesh)
        assert k.sharding.is_equivalent_to(want, k.ndim), (axes, k.sharding, want)
        if axes == {"fsdp": 4, "tensor": 2}:
            assert k.sharding.shard_shape(k.shape) == (2, 2, 16, 16), k.sharding
        got = Engine(model, [95], 0, slots=8, chunk=3, kv="dense").generate(ids, mask, 6, temperature=1.0, n=2, seed=3)
        np.testing.assert_array_equal(got.tokens, single_samples[2], err_msg=f"dense engine, {axes}")
        if axes in PAGED_MESHES:  # the paged engine: pools and slots split over the batch axes, kv heads over tensor
            engine = Engine(model, [95], 0, slots=8, chunk=3, kv="paged", page_size=4, pages=24)
            assert engine.shards == axes.get("data", 1) * axes.get("fsdp", 1)
            got = engine.generate(ids, mask, 6, temperature=1.0, n=2, seed=3)
            np.testing.assert_array_equal(got.tokens, single_samples[2], err_msg=f"paged engine, {axes}")
            np.testing.assert_allclose(got.logprobs, single_samples[3], atol=1e-4, err_msg=f"paged engine, {axes}")
            # (4 shards of 5 usable pages, 2 slots each, rows of 4 pages: the second row of a shard waits)
            print("ok paged", axes)
        placed = sharding.shard_model(qwen3.from_pretrained(path), mesh)  # after the fact
        assert placed.layers["q_proj"].value.sharding == q.sharding
        print("ok", axes, q.sharding.spec)


def multihost():
    """The engine over a mesh of every process's devices gives each process the Sampler's tokens."""
    ids, mask = inputs()
    want = sample(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), ids, mask)  # (this process's first device)
    mesh = sharding.make_mesh({"fsdp": -1})
    model = sharding.shard_model(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), mesh)
    batch = sharding.batch_sharding(mesh)
    spread = lambda x: jax.make_array_from_callback(x.shape, batch, lambda i: np.asarray(x)[i])  # noqa: E731
    for kv in ("dense", "paged"):
        engine = Engine(model, [95], 0, slots=8, chunk=3, kv=kv, page_size=4)
        got = engine.generate(spread(ids), spread(mask), 6, temperature=1.0, n=2, seed=3)  # (rows over processes)
        np.testing.assert_array_equal(got.tokens, want[2], err_msg=kv)
        np.testing.assert_allclose(got.logprobs, want[3], atol=1e-4, err_msg=kv)
        print("ok multihost", kv, jax.process_index(), flush=True)


if __name__ == "__main__":
    multihost() if MULTIHOST else main(sys.argv[1])
