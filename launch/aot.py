"""Compile the real Qwen3 steps ahead of time for TPU topologies, from a CPU machine.

  pip install -e ".[tpu]"
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot [--preset=qwen3-4b] \
      [--topologies=v5e:4x4,v5p:4x4x4,v4:4x4x8] [--batch=64] [--length=2048] [--attention=splash] \
      [--attn_chunk=512] [--what=train,prefill,decode] [--meshes=fsdp=16,fsdp=8xtensor=2]
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot --config=configs/qwen3_4b.py --what=train,prefill,decode
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot --config=configs/qwen3_4b.py --suggest

With --config the model section (preset, dtype, remat, attention, attn_chunk) and the shapes come
from a stage-loop config: the update's micro-batch (grpo.prompts x group_size / micro_batches
rows) at --prompt_tokens + rollout.max_new_tokens tokens, the prefill of grpo.prompts prompts and
the decode step at the whole rollout batch. `--attention=auto` compiles splash (the TPU choice).
Splash runs as a Pallas custom call whose FLOPs the cost analysis does not count: `flops` then
covers the rest of the step (`model_flops` counts attention analytically).

What is compiled:
- train: next-token cross-entropy forward + backward of the whole model (layers scanned, remat
  per --remat; log-probs in chunks of --logits_chunk tokens, so the [B, T, 151936] logits never
  exist at once) and an optax AdamW update, parameters and optimizer state sharded by
  t2t_jax.sharding's logical rules, the batch over the data axes, both donated. A GRPO step adds
  a frozen reference model when beta > 0 (`ref_model_bytes` per chip, not in `fits`) and
  per-token log-prob work of the same order as this step.
- prefill: the sampler's first call, prompts into an empty KV cache (through the kernel).
- decode: one sampler step, a token per row over the whole dense cache.
- paged_decode: one engine step through the paged cache (t2t_jax/models/paged.py): the Pallas
  `paged_attention` kernel (with --attention=splash / auto; else the gathered dense one), a pool of
  --kv_tokens tokens in pages of --page_size (0: every row at --decode_length, the dense cache's
  tokens) split over the batch axes with the rows, kv heads over `tensor`.
Parameters are abstract (`jax.ShapeDtypeStruct` with shardings): no weights needed.

`--suggest` searches micro-batch counts (1, 2, 4, ...) x meshes for the fewest micro-batches that
fit each topology and prints the config overrides (`--config.train.micro_batches=...
--config.mesh.*=...`).

Prints one JSON object per line per (topology, mesh, what): `fits`, per-chip `peak_bytes`,
`argument_bytes`, `output_bytes`, `temp_bytes`, `alias_bytes` (`memory_analysis()`), `flops` per
chip (`cost_analysis()`), the chip's `hbm_bytes`, the step's `tokens` and `model_flops`, and time
estimates from the chip's peak: `step_s_at_mfu` / `tokens_per_s_at_mfu` at --mfu, the
`memory_bound_s` floor (arguments read once at HBM bandwidth) and, with --tokens_per_s, the
`mfu_needed` to reach it.
"""

from __future__ import annotations

if __name__ == "__main__":  # restart with the malloc tunable before jax loads: t2t_jax/hostenv.py
    from t2t_jax import hostenv

    hostenv.reexec_with_malloc_tunables()

import json
import math
import os
import time

os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # (no chips here: compiles may run side by side)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from t2t_jax import cli, sharding  # noqa: E402
from t2t_jax.models import qwen3  # noqa: E402
from t2t_jax.models.paged import PagedKV, pool_shards  # noqa: E402
from t2t_jax.perf import CHIPS, model_flops  # noqa: E402

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
flags.DEFINE_list(
    "what",
    ["train"],
    "What to compile: train (the update), prefill, decode (one sampler step, dense cache), paged_decode (one engine "
    "step through the paged cache).",
)
flags.DEFINE_integer("decode_batch", 64, "Rows of the decode step (prompts x samples: 8 x 8).")
flags.DEFINE_integer("decode_length", 8192, "KV cache length of the decode step (prompt + new tokens).")
flags.DEFINE_integer("page_size", 64, "paged_decode: tokens per page.")
flags.DEFINE_integer(
    "kv_tokens", 0, "paged_decode: tokens the page pool holds over all rows (0: every row at --decode_length)."
)
_CONFIG = cli.DEFINE_config_file(
    "config", None, "A stage-loop config (e.g. configs/qwen3_4b.py): its model and shapes replace the flags above."
)
flags.DEFINE_list(
    "meshes", [], "Only these meshes, e.g. fsdp=16,fsdp=8xtensor=2 ('x' joins axes; default: every candidate)."
)
flags.DEFINE_integer("prompt_tokens", 512, "With --config: the longest prompt (its length bucket), in tokens.")
flags.DEFINE_integer("samples", 8, "Samples per prompt: the prefill runs on decode_batch / samples prompts.")
flags.DEFINE_float(
    "mfu", 0.4, "Model-FLOPs utilisation for the step-time estimate (`step_s_at_mfu`).", lower_bound=0.01
)
flags.DEFINE_float("tokens_per_s", 0, "A target throughput (global tokens/s): each row reports the MFU it needs.")
flags.DEFINE_bool(
    "suggest", False, "Search micro-batch counts (1, 2, 4, ...) x meshes for the fewest that fit each topology."
)


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


def report(compiled, seconds, topo, topo_name, axes, config, *, what, rows, length, cache_length=0, **extra):
    """One JSON row: memory per chip (`memory_analysis`), `flops` per chip (`cost_analysis`;
    a Pallas kernel's own FLOPs are not in it), the step's `model_flops`, and time estimates:
    `step_s_at_mfu` at --mfu, `memory_bound_s` (each chip reading its arguments once at HBM
    bandwidth: a floor, the decode step's usual bound), and with --tokens_per_s the MFU needed."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    kind = topo.devices[0].device_kind
    hbm, peak_flops, bandwidth = CHIPS.get(kind, (None, None, None))
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    chips = len(topo.devices)
    tokens = rows * length
    flops = model_flops(config, what, rows, length, cache_length)
    row = {
        "topology": topo_name,
        "mesh": axes,
        "what": what,
        "device_kind": kind,
        "chips": chips,
        "fits": bool(hbm and peak <= hbm),
        "peak_bytes": int(peak),
        "hbm_bytes": hbm,
        "argument_bytes": int(mem.argument_size_in_bytes),
        "output_bytes": int(mem.output_size_in_bytes),
        "temp_bytes": int(mem.temp_size_in_bytes),
        "alias_bytes": int(mem.alias_size_in_bytes),
        "flops": float(cost.get("flops", -1)),
        "tokens": tokens,
        "model_flops": flops,
        "compile_s": round(seconds, 1),
        "preset": FLAGS.preset,
        "rows": rows,
        "length": length,
        **extra,
    }
    if peak_flops:
        step_s = flops / (chips * peak_flops * FLAGS.mfu)
        row.update(
            peak_flops_per_chip=peak_flops,
            mfu=FLAGS.mfu,
            step_s_at_mfu=_sig(step_s),
            tokens_per_s_at_mfu=_sig(tokens / step_s),
            memory_bound_s=_sig(mem.argument_size_in_bytes / bandwidth),
        )
        if FLAGS.tokens_per_s:
            row["mfu_needed"] = _sig(FLAGS.tokens_per_s * flops / tokens / (chips * peak_flops))
    return row


def _sig(x: float) -> float:
    return float(f"{x:.3g}")


def cache_spec(config, mesh, rows, length):
    """An abstract KV cache of `rows` x `length` slots, rows over the batch axes and kv heads over
    `tensor` where they divide."""
    batch_axes = sharding.batch_sharding(mesh).spec[0]
    kv = "tensor" if "tensor" in mesh.shape and config.num_key_value_heads % mesh.shape["tensor"] == 0 else None
    kv_shard = NamedSharding(mesh, PartitionSpec(batch_axes, kv, None, None))
    layer_kv = tuple(
        jax.ShapeDtypeStruct(
            (rows, config.num_key_value_heads, length, config.head_dim), jnp.bfloat16, sharding=kv_shard
        )
        for _ in range(config.num_hidden_layers)
    )
    return qwen3.KVCache(
        k=layer_kv,
        v=layer_kv,
        valid=jax.ShapeDtypeStruct((rows, length), bool, sharding=sharding.batch_sharding(mesh)),
        next_pos=jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1)),
        index=jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec())),
    )


def abstract(tree, shardings):
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree, shardings)


def compile_decode(config, topo, mesh, rows):
    """One sampler decode step: a token per row, the KV cache donated and updated in place."""
    graphdef, params, param_shardings = abstract_model(config, mesh, "bfloat16")
    s = FLAGS.decode_length
    tok = jax.ShapeDtypeStruct((rows, 1), jnp.int32, sharding=sharding.batch_sharding(mesh))

    # The step as the sampler's loop runs it (unrolled layers over per-layer weights), except that
    # the weights are sliced here per step; the sampler slices once per generation and holds that
    # copy beside the params (one more weight copy per chip, not in these figures).
    def step(params, cache, tok):
        model = nnx.merge(graphdef, params)
        logits, cache = model(tok, jnp.ones(tok.shape, bool), cache=cache, layers=model.unstack_layers())
        return jnp.argmax(logits[:, -1], -1), cache

    args = (abstract(params, param_shardings), cache_spec(config, mesh, rows, s), tok)
    compiled, seconds = timed_compile(jax.jit(step, donate_argnums=(1,)), *args)
    return compiled, seconds, dict(rows=rows, length=1, cache_length=s, attention="xla (decode step)")


def paged_cache_spec(config, mesh, rows, length):
    """An abstract paged cache: a pool of --kv_tokens tokens (pages over the batch axes, kv heads
    over `tensor` where they divide, a null page per shard), a table of `length` tokens per row."""
    batch_axes = sharding.batch_sharding(mesh).spec[0]
    kv = "tensor" if "tensor" in mesh.shape and config.num_key_value_heads % mesh.shape["tensor"] == 0 else None
    shards, page = pool_shards(mesh, rows), FLAGS.page_size
    tokens = FLAGS.kv_tokens or rows * length
    pages = -(-(-(-tokens // page) + shards) // shards) * shards
    pool = jax.ShapeDtypeStruct(
        (config.num_key_value_heads, pages, page, config.head_dim),
        jnp.bfloat16,
        sharding=NamedSharding(mesh, PartitionSpec(kv, batch_axes, None, None)),
    )
    layers = tuple(pool for _ in range(config.num_hidden_layers))
    return PagedKV(
        k=layers,
        v=layers,
        table=jax.ShapeDtypeStruct((rows, -(-length // page)), jnp.int32, sharding=sharding.batch_sharding(mesh)),
        lengths=jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1)),
    ), pages


def compile_paged_decode(config, topo, mesh, rows):
    """One engine decode step through the paged cache: a token per row, the pools donated."""
    graphdef, params, param_shardings = abstract_model(config, mesh, "bfloat16")
    s = FLAGS.decode_length
    tok = jax.ShapeDtypeStruct((rows, 1), jnp.int32, sharding=sharding.batch_sharding(mesh))
    kernel = nnx.merge(graphdef, params).paged_kernel

    def step(params, cache, tok):
        model = nnx.merge(graphdef, params)
        logits, cache = model(tok, jnp.ones(tok.shape, bool), cache=cache, layers=model.unstack_layers())
        return jnp.argmax(logits[:, -1], -1), cache

    cache, pages = paged_cache_spec(config, mesh, rows, s)
    args = (abstract(params, param_shardings), cache, tok)
    compiled, seconds = timed_compile(jax.jit(step, donate_argnums=(1,)), *args)
    pool = cache.k[0]
    per_chip = math.prod(pool.sharding.shard_shape(pool.shape)) * pool.dtype.itemsize * 2 * len(cache.k)
    held = (pages - pool_shards(mesh, rows)) * FLAGS.page_size  # (the pool's tokens, null pages aside)
    return (
        compiled,
        seconds,
        dict(
            rows=rows,
            length=1,
            cache_length=held // rows,  # (tokens a row holds on average when the pool is full)
            attention=kernel,
            page_size=FLAGS.page_size,
            pages=pages,
            kv_tokens=held,
            pool_bytes_per_chip=int(per_chip),
        ),
    )


def compile_prefill(config, topo, mesh, rows):
    """The sampler's prefill: `rows` prompts of --prompt_tokens into an empty cache of
    --decode_length slots (through the model's kernel), the last position's logits out."""
    graphdef, params, param_shardings = abstract_model(config, mesh, "bfloat16")
    p, s = FLAGS.prompt_tokens, FLAGS.decode_length
    ids = jax.ShapeDtypeStruct((rows, p), jnp.int32, sharding=sharding.batch_sharding(mesh))

    def prefill(params, cache, ids):
        model = nnx.merge(graphdef, params)
        h, cache = model.hidden(ids, jnp.ones(ids.shape, bool), cache=cache, prefill=True)
        return model.logits_from_hidden(h[:, -1]), cache

    args = (abstract(params, param_shardings), cache_spec(config, mesh, rows, s), ids)
    compiled, seconds = timed_compile(jax.jit(prefill, donate_argnums=(1,)), *args)
    return compiled, seconds, dict(rows=rows, length=p, cache_length=s, attention=FLAGS.attention)


def compile_train(config, topo, mesh, rows):
    """The update: forward + backward + AdamW at `rows` x --length, parameters and optimizer
    state donated."""
    graphdef, params, param_shardings = abstract_model(config, mesh, FLAGS.param_dtype)
    opt = optax.adamw(1e-6, weight_decay=0.01)
    opt_state = jax.eval_shape(opt.init, params)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        opt, lambda _, s: s, opt_state, param_shardings, transform_non_params=lambda _: replicated
    )
    ids = jax.ShapeDtypeStruct((rows, FLAGS.length + 1), jnp.int32, sharding=sharding.batch_sharding(mesh))
    step = jax.jit(
        train_step_fn(graphdef, opt), donate_argnums=(0, 1), out_shardings=(param_shardings, opt_shardings, replicated)
    )
    args = (abstract(params, param_shardings), abstract(opt_state, opt_shardings), ids)
    compiled, seconds = timed_compile(step, *args)
    ref_bytes = 2 * qwen3.num_params(config) // mesh.size  # a bf16 reference, fully sharded
    extra = dict(rows=rows, length=FLAGS.length, remat=FLAGS.remat, attention=FLAGS.attention)
    return compiled, seconds, dict(extra, attn_chunk=FLAGS.attn_chunk, ref_model_bytes=int(ref_bytes))


def timed_compile(fn, *args):
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start


COMPILERS = {
    "train": compile_train,
    "prefill": compile_prefill,
    "decode": compile_decode,
    "paged_decode": compile_paged_decode,
}


def compile_row(config, what: str, topo_name: str, axes: dict, rows: int) -> dict:
    """Compile `what` for one (topology, mesh) at `rows` rows -> its report row (a failed
    compile is a row with `error`: one mesh failing says nothing of the others)."""
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=topo_name)
        mesh = sharding.make_mesh(axes, devices=topo.devices)
        compiled, seconds, extra = COMPILERS[what](config, topo, mesh, rows)
        return report(compiled, seconds, topo, topo_name, axes, config, what=what, **extra)
    except Exception as e:  # noqa: BLE001
        return {
            "topology": topo_name,
            "mesh": axes,
            "what": what,
            "rows": rows,
            "fits": False,
            "error": f"{type(e).__name__}: {str(e)[:300]}",
        }


def rows_of(what: str) -> int:
    return {"train": FLAGS.batch, "prefill": max(1, FLAGS.decode_batch // FLAGS.samples)}.get(what, FLAGS.decode_batch)


def mesh_overrides(axes: dict) -> str:
    full = {"data": axes.get("data", 1), "fsdp": axes.get("fsdp", 1), "tensor": axes.get("tensor", 1)}
    return " ".join(f"--config.mesh.{a}={v}" for a, v in full.items())


def suggest(config, topo_name: str, total: int, candidates_for, emit) -> dict:
    """The fewest micro-batches (1, 2, 4, ... of `total` rows) with a mesh that fits, and the
    config overrides that select them; every compile is emitted as a row on the way."""
    m = 1
    while m <= total and total % m == 0:
        for axes in candidates_for(total // m):
            row = compile_row(config, "train", topo_name, axes, total // m)
            emit(row)
            if row["fits"]:
                overrides = f"--config.train.micro_batches={m} {mesh_overrides(axes)}"
                return {
                    "suggest": topo_name,
                    "micro_batches": m,
                    "rows": total // m,
                    "mesh": axes,
                    "overrides": overrides,
                }
        m *= 2
    return {"suggest": topo_name, "micro_batches": None, "note": f"no mesh fits even {total // (m // 2)} rows"}


def from_config(config) -> dict:
    """The flag values a stage-loop config implies: its model section, the GRPO update's
    micro-batch (grpo.prompts x group_size / train.micro_batches rows) at the longest sequence
    (--prompt_tokens + rollout.max_new_tokens), and the decode step at the rows in flight (the
    engine's rollout.slots, or the whole rollout batch with rollout.engine=static), its prefill
    at those rows' prompts (rows / group_size)."""
    m, g, t, r = config.model, config.grpo, config.train, config.rollout
    rows = g.prompts * g.group_size
    in_flight = min(rows, r.slots) if r.get("engine", "static") == "continuous" else rows
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
        "decode_batch": in_flight,
        "samples": g.group_size,
        "decode_length": FLAGS.prompt_tokens + config.rollout.max_new_tokens,
        "rollout_rows": rows,
    }


def main(argv):
    del argv
    total = FLAGS.batch  # what --suggest splits into micro-batches: the whole GRPO batch
    if _CONFIG.value is not None:
        implied = from_config(_CONFIG.value)
        total = implied["rollout_rows"]
        for name, value in implied.items():
            if name in FLAGS:
                setattr(FLAGS, name, value)
        if _CONFIG.value.grpo.beta:
            print(json.dumps({"note": "grpo.beta > 0: add ref_model_bytes per chip to each train row's peak"}))
        print(json.dumps({"from_config": implied}), flush=True)
    if FLAGS.attention == "auto":
        FLAGS.attention = "splash"  # (TPU topologies)
    unknown = sorted(set(FLAGS.what) - set(COMPILERS))
    if unknown:
        raise app.UsageError(f"--what: {unknown} not among {sorted(COMPILERS)}")
    wanted = [{a: int(v) for a, v in (x.split("=") for x in m.split("x"))} for m in FLAGS.meshes]
    config = qwen3.PRESETS[FLAGS.preset]
    emit = lambda row: print(json.dumps(row), flush=True)  # noqa: E731
    for topo_name in FLAGS.topologies:
        n = len(topologies.get_topology_desc(platform="tpu", topology_name=topo_name).devices)

        def candidates_for(rows):
            return [m for m in meshes(n, rows) if not wanted or m in wanted]

        for what in FLAGS.what:
            if what == "train" and FLAGS.suggest:
                emit(suggest(config, topo_name, total, candidates_for, emit))
                continue
            rows = rows_of(what)
            for axes in candidates_for(rows):
                emit(compile_row(config, what, topo_name, axes, rows))
            if not candidates_for(rows):
                emit(
                    {
                        "topology": topo_name,
                        "what": what,
                        "rows": rows,
                        "fits": False,
                        "error": "no mesh's batch axes divide the rows",
                    }
                )


if __name__ == "__main__":
    cli.run(main)
