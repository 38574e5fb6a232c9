"""Compile the real Qwen3 training step ahead of time for TPU topologies, from a CPU machine.

  pip install -e ".[tpu]"
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot [--preset=qwen3-4b] \
      [--topologies=v5e:4x4,v5p:4x4x4,v4:4x4x8] [--batch=64] [--length=2048] [--attention=splash] \
      [--attn_chunk=512] [--what=train,decode]
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot --config=configs/qwen3_4b.py --what=train,decode

With --config the model section (preset, dtype, remat, attention, attn_chunk) and the shapes come
from a stage-loop config: the update's micro-batch (grpo.prompts x group_size / micro_batches
rows) at --prompt_tokens + rollout.max_new_tokens tokens, the decode step at the whole rollout
batch. `--attention=auto` compiles splash (the TPU choice). Splash runs as a Pallas custom call
whose FLOPs the cost analysis does not count: `flops` then covers the rest of the step.

What is compiled: next-token cross-entropy forward + backward of the whole model (layers scanned,
remat per --remat; log-probs in chunks of --logits_chunk tokens, so the [B, T, 151936] logits
never exist at once) and an optax AdamW update, parameters and optimizer state sharded by
t2t_jax.sharding's logical rules, the batch over the data axes, parameters and optimizer state
donated. Parameters are abstract (`jax.ShapeDtypeStruct` with shardings): no weights needed.
A GRPO step adds a frozen reference model (one more bf16 copy of the parameters when beta > 0)
and per-token log-prob work of the same order as this step; `fits` leaves that headroom out,
`ref_model_bytes` says how much it needs.

Prints one JSON object per line per (topology, mesh): `topology`, `mesh`, `fits`, compile
seconds, per-device `argument_bytes`, `output_bytes`, `temp_bytes`, `alias_bytes` from
`memory_analysis()`, `flops` from `cost_analysis()`, and the chip's `hbm_bytes`.
"""

from __future__ import annotations

if __name__ == "__main__":  # restart with the malloc tunable before jax loads: t2t_jax/hostenv.py
    from t2t_jax import hostenv

    hostenv.reexec_with_malloc_tunables()

import json
import os
import time

os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from t2t_jax import sharding  # noqa: E402
from t2t_jax.models import qwen3  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "qwen3-4b", "Model preset.")
flags.DEFINE_list("topologies", ["v5e:4x4", "v5p:4x4x4", "v4:4x4x8"], "TPU topologies.")
flags.DEFINE_integer("batch", 64, "Global batch (sequences): 8 prompts x groups of 8.")
flags.DEFINE_integer("length", 2048, "Tokens per sequence (prompt + completion).")
flags.DEFINE_string("remat", "full", "Remat policy: none, dots, full.")
flags.DEFINE_string("param_dtype", "float32", "Master weight dtype (compute is bf16).")
flags.DEFINE_integer("logits_chunk", 256, "Tokens per logits chunk (never [B, T, V] at once).")
flags.DEFINE_integer("attn_chunk", 0, "Query block of the chunked attention kernel (0: full attention).")
flags.DEFINE_string(
    "attention", "xla", "Attention kernel: xla, chunked (with --attn_chunk), splash (Pallas, TPU), auto (splash)."
)
flags.DEFINE_list("what", ["train"], "What to compile: train (the update) and/or decode (one sampler step).")
flags.DEFINE_integer("decode_batch", 64, "Rows of the decode step (prompts x samples: 8 x 8).")
flags.DEFINE_integer("decode_length", 8192, "KV cache length of the decode step (prompt + new tokens).")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A stage-loop config (e.g. configs/qwen3_4b.py): its model and shapes replace the flags above."
)
flags.DEFINE_list(
    "meshes", [], "Only these meshes, e.g. fsdp=16,fsdp=8xtensor=2 ('x' joins axes; default: every candidate)."
)
flags.DEFINE_integer("prompt_tokens", 512, "With --config: the longest prompt (its length bucket), in tokens.")

HBM = {
    "TPU v4": 32 * 2**30,
    "TPU v5 lite": 16 * 2**30,
    "TPU v5": 95 * 2**30,
    "TPU v5p": 95 * 2**30,
    "TPU v6 lite": 32 * 2**30,
}


def meshes(n, batch):
    """Candidate meshes for n chips: FSDP x tensor (tensor 1..8) and data x FSDP, keeping
    only those whose batch axes (data x fsdp) divide the global batch."""
    out = [{"fsdp": n // t, "tensor": t} if t > 1 else {"fsdp": n} for t in (1, 2, 4, 8) if n % t == 0]
    if n >= 16:
        out.append({"data": 2, "fsdp": n // 2})
    return [m for m in out if batch % (m.get("data", 1) * m["fsdp"]) == 0]


def train_step_fn(graphdef, opt):
    def loss(params, ids):
        model = nnx.merge(graphdef, params)
        h = model.hidden(ids[:, :-1])
        return -model.token_logprobs(h, ids[:, 1:], chunk=FLAGS.logits_chunk).mean()

    def step(params, opt_state, ids):
        value, grads = jax.value_and_grad(loss)(params, ids)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


def abstract_model(config, mesh, param_dtype):
    """(graphdef, abstract params, their shardings) of a Qwen3 on `mesh` (no weights)."""
    model = nnx.eval_shape(
        lambda: qwen3.Qwen3(
            config,
            dtype=jnp.bfloat16,
            param_dtype=jnp.dtype(param_dtype),
            remat=FLAGS.remat,
            attention=FLAGS.attention,
            attn_chunk=FLAGS.attn_chunk,
            mesh=mesh,
        )
    )
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)

    def shard_of(path, leaf):
        name = str(getattr(path[-1], "key", path[-1]))
        return sharding.param_sharding(qwen3.Qwen3.logical_axes(name), leaf.shape, mesh)

    return graphdef, params, jax.tree_util.tree_map_with_path(shard_of, params)


def report(compiled, seconds, topo, topo_name, axes, config, **extra):
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    kind = topo.devices[0].device_kind
    hbm = HBM.get(kind)
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    return {
        "topology": topo_name,
        "mesh": axes,
        "device_kind": kind,
        "chips": len(topo.devices),
        "fits": bool(hbm and peak <= hbm),
        "peak_bytes": int(peak),
        "hbm_bytes": hbm,
        "argument_bytes": int(mem.argument_size_in_bytes),
        "output_bytes": int(mem.output_size_in_bytes),
        "temp_bytes": int(mem.temp_size_in_bytes),
        "alias_bytes": int(mem.alias_size_in_bytes),
        "flops": float(cost.get("flops", -1)),
        "compile_s": round(seconds, 1),
        "preset": FLAGS.preset,
        **extra,
    }


def compile_decode(config, topo_name, axes):
    """One sampler decode step (a token per row, the KV cache donated and updated in place)."""
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topo_name)
    mesh = sharding.make_mesh(axes, devices=topo.devices)
    graphdef, params, param_shardings = abstract_model(config, mesh, "bfloat16")
    b, s = FLAGS.decode_batch, FLAGS.decode_length
    batch_axes = sharding.batch_sharding(mesh).spec[0]
    kv = "tensor" if "tensor" in mesh.shape and config.num_key_value_heads % mesh.shape["tensor"] == 0 else None
    kv_shard = NamedSharding(mesh, PartitionSpec(batch_axes, kv, None, None))
    row = sharding.batch_sharding(mesh, 1)
    layer_kv = tuple(
        jax.ShapeDtypeStruct((b, config.num_key_value_heads, s, config.head_dim), jnp.bfloat16, sharding=kv_shard)
        for _ in range(config.num_hidden_layers)
    )
    cache = qwen3.KVCache(
        k=layer_kv,
        v=layer_kv,
        valid=jax.ShapeDtypeStruct((b, s), bool, sharding=sharding.batch_sharding(mesh)),
        next_pos=jax.ShapeDtypeStruct((b,), jnp.int32, sharding=row),
        index=jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec())),
    )
    tok = jax.ShapeDtypeStruct((b, 1), jnp.int32, sharding=sharding.batch_sharding(mesh))

    # The step as the sampler's loop runs it (unrolled layers over per-layer weights), except that
    # the weights are sliced here per step; the sampler slices once per generation and holds that
    # copy beside the params (one more weight copy per chip, not in these figures).
    def step(params, cache, tok):
        model = nnx.merge(graphdef, params)
        logits, cache = model(tok, jnp.ones(tok.shape, bool), cache=cache, layers=model.unstack_layers())
        return jnp.argmax(logits[:, -1], -1), cache

    abstract = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), params, param_shardings)
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(1,)).lower(abstract, cache, tok).compile()
    return report(
        compiled,
        time.perf_counter() - start,
        topo,
        topo_name,
        axes,
        config,
        what="decode",
        decode_batch=b,
        decode_length=s,
    )


def compile_one(config, topo_name, axes):
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topo_name)
    mesh = sharding.make_mesh(axes, devices=topo.devices)
    graphdef, params, param_shardings = abstract_model(config, mesh, FLAGS.param_dtype)
    opt = optax.adamw(1e-6, weight_decay=0.01)
    opt_state = jax.eval_shape(opt.init, params)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        opt, lambda _, s: s, opt_state, param_shardings, transform_non_params=lambda _: replicated
    )
    batch_shard = sharding.batch_sharding(mesh)
    ids = jax.ShapeDtypeStruct((FLAGS.batch, FLAGS.length + 1), jnp.int32, sharding=batch_shard)
    abstract = lambda tree, shards: jax.tree.map(  # noqa: E731
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shards
    )
    step = jax.jit(
        train_step_fn(graphdef, opt), donate_argnums=(0, 1), out_shardings=(param_shardings, opt_shardings, replicated)
    )
    start = time.perf_counter()
    compiled = step.lower(abstract(params, param_shardings), abstract(opt_state, opt_shardings), ids).compile()
    seconds = time.perf_counter() - start
    ref_bytes = 2 * qwen3.num_params(config) // len(topo.devices)  # a bf16 reference, fully sharded
    return report(
        compiled,
        seconds,
        topo,
        topo_name,
        axes,
        config,
        what="train",
        ref_model_bytes=int(ref_bytes),
        batch=FLAGS.batch,
        length=FLAGS.length,
        remat=FLAGS.remat,
        attention=FLAGS.attention,
        attn_chunk=FLAGS.attn_chunk,
    )


def from_config(config) -> dict:
    """The flag values a stage-loop config implies: its model section, the GRPO update's
    micro-batch (grpo.prompts x group_size / train.micro_batches rows) at the longest sequence
    (--prompt_tokens + rollout.max_new_tokens), and the decode step at the rollout batch."""
    m, g, t = config.model, config.grpo, config.train
    rows = g.prompts * g.group_size
    if rows % t.micro_batches:
        raise app.UsageError(f"train.micro_batches: {t.micro_batches} does not divide the batch of {rows} rows")
    return {
        "preset": m.preset,
        "param_dtype": m.dtype,
        "remat": m.remat,
        "attention": m.attention,
        "attn_chunk": m.attn_chunk,
        "batch": rows // t.micro_batches,
        "length": FLAGS.prompt_tokens + config.rollout.max_new_tokens,
        "decode_batch": rows,
        "decode_length": FLAGS.prompt_tokens + config.rollout.max_new_tokens,
    }


def main(argv):
    del argv
    if _CONFIG.value is not None:
        implied = from_config(_CONFIG.value)
        for name, value in implied.items():
            setattr(FLAGS, name, value)
        if _CONFIG.value.grpo.beta:
            print(json.dumps({"note": "grpo.beta > 0: add ref_model_bytes per chip to each train row's peak"}))
        print(json.dumps({"from_config": implied}), flush=True)
    if FLAGS.attention == "auto":
        FLAGS.attention = "splash"  # (TPU topologies)
    config = qwen3.PRESETS[FLAGS.preset]
    for topo_name in FLAGS.topologies:
        n = len(topologies.get_topology_desc(platform="tpu", topology_name=topo_name).devices)
        for what in FLAGS.what:
            fn = {"train": compile_one, "decode": compile_decode}[what]
            candidates = meshes(n, FLAGS.batch if what == "train" else FLAGS.decode_batch)
            if FLAGS.meshes:
                wanted = [{a: int(v) for a, v in (x.split("=") for x in m.split("x"))} for m in FLAGS.meshes]
                candidates = [m for m in candidates if m in wanted]
            for axes in candidates:
                try:
                    row = fn(config, topo_name, axes)
                except Exception as e:  # report and go on: one mesh failing says nothing of the others
                    row = {
                        "topology": topo_name,
                        "mesh": axes,
                        "what": what,
                        "fits": False,
                        "error": f"{type(e).__name__}: {str(e)[:300]}",
                    }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
