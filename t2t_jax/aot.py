"""Ahead-of-time compiles of the run's own steps for TPU topologies, from a CPU machine (needs
libtpu: the `tpu` extra). `launch/aot.py` is its command line; the tests call these functions.

    sizes = Sizes.from_config(config, prompt_tokens=512)
    row = compile_row(config, sizes, "train", "v5e:4x4", {"fsdp": 16})   # one JSON-able dict
    suggestion = suggest(config, sizes, "v5e:4x4", candidates, emit)     # the fewest micro-batches

Everything is abstract (`jax.ShapeDtypeStruct`s with shardings on the topology's mesh): no
weights, no chips. What is compiled (`COMPILERS`):
- train: the `Trainer`'s own jitted GRPO update (t2t_jax/rl/trainer.py, `Trainer.lower`), built
  from the config as the stage loop builds it: `train.micro_batches` slices scanned with exact
  gradient accumulation, the clipped GRPO loss with old log-probs and advantages (and the
  reference log-probs when `grpo.beta` > 0), the sampler-drift metrics, global-norm clipping and
  AdamW under `optax.apply_if_finite`. The state is `Trainer.state_shapes()` (the shardings
  `Trainer.init` gives), the batch `Trainer.batch_shapes(...)` (`Trainer.shard`'s): grpo.prompts x
  group_size rows of the prompt bucket + rollout.max_new_tokens tokens, with `old_logps` when
  grpo.old_logprobs is "sampler" or grpo.num_iterations > 1 and `ref_logps` when grpo.beta > 0.
  The reference params themselves stay resident beside the state (`ref_model_bytes` per chip,
  not in `fits`).
- prefill: the engine's prefill (t2t_jax/sampling/slots.py `prefill`, the engine's jitted one):
  the prompts of the first admission (rollout.slots / group_size, rounded up to a power of two as
  the engine does) into a cache of their own length, through the model's kernel.
- decode / paged_decode: the engine's jitted decode chunk (slots.py `decode`: a `while_loop` of
  up to rollout.chunk steps over every slot, sampling included) at the cache the engine
  allocates for the config's rows: `Engine.slot_tokens(prompt + max_new_tokens)` tokens per slot,
  dense, or paged in a pool of `Engine.pool_pages(...)` pages (rollout.pages, 0: every slot at
  its full length). The slots' state comes from compiling the engine's own `empty`, with the
  shardings it gives (the dense cache's rows and the paged pools over the batch axes, kv heads
  over `tensor`; a leaf off the mesh is replicated, as the decode would replicate it).

Each row: `fits`, per-chip `peak_bytes` (arguments + outputs + temporaries - aliased),
`argument_bytes`, `output_bytes`, `temp_bytes`, `alias_bytes` (`memory_analysis()`), `flops` per
chip (`cost_analysis()`; a Pallas kernel's own FLOPs are not in it), the chip's `hbm_bytes`, the
step's `tokens` and `model_flops` (t2t_jax/perf.py) and estimates from the chip's peak:
`step_s_at_mfu` / `tokens_per_s_at_mfu` at `mfu`, `memory_bound_s` (arguments read once at HBM
bandwidth) and with `tokens_per_s` the `mfu_needed`. Decode rows also give `train_state_bytes`:
the optimizer state (and reference params) that stay resident while the engine runs, and
`fits_with_train_state`. Per-step figures for decode (one token per slot); `chunk` steps run
per call.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time

os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # (no chips here: compiles may run side by side)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from t2t_jax import models, sharding  # noqa: E402
from t2t_jax.perf import CHIPS, model_flops  # noqa: E402
from t2t_jax.rl.trainer import Trainer, TrainSettings  # noqa: E402
from t2t_jax.sampling.engine import Engine  # noqa: E402
from t2t_jax.sampling.scheduler import next_pow2  # noqa: E402

STOP_IDS = (151645, 151643)  # (Qwen3's <|im_end|>, <|endoftext|>: only their count matters)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes compiled. prompt: the prompt bucket P (tokens); completion: C, the update's
    completion width (rollout.max_new_tokens); rows: the update's batch (grpo.prompts x
    group_size); slots: decode rows in flight (rollout.slots; the whole batch with
    rollout.engine=static); decode_tokens: what a slot's rows need (P + C: the engine allocates
    `slot_tokens` of it); prefill_prompts: prompts of the first admission (slots / group_size)."""

    prompt: int
    completion: int
    rows: int
    slots: int
    decode_tokens: int
    prefill_prompts: int
    kv_tokens: int = 0  # (paged: a pool of this many tokens in place of rollout.pages; 0: rollout.pages)

    @classmethod
    def from_config(cls, config, prompt_tokens: int = 512) -> Sizes:
        g, r = config.grpo, config.rollout
        rows = g.prompts * g.group_size
        slots = min(rows, r.slots) if r.get("engine", "continuous") == "continuous" else rows
        return cls(
            prompt=prompt_tokens,
            completion=r.max_new_tokens,
            rows=rows,
            slots=slots,
            decode_tokens=prompt_tokens + r.max_new_tokens,
            prefill_prompts=max(1, slots // g.group_size),
        )


@dataclasses.dataclass(frozen=True)
class Report:
    """How rows are reported: `mfu` for the time estimates, `tokens_per_s` (0: none) for
    `mfu_needed`, `param_dtype` (None: the config's model.dtype) for the weights."""

    mfu: float = 0.4
    tokens_per_s: float = 0.0
    param_dtype: str | None = None


# ---- abstract model, state and batch ------------------------------------------------------------
def topology_mesh(topo_name: str, axes: dict):
    """(topology, mesh) of a TPU topology name (e.g. "v5e:4x4") and mesh axes."""
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(platform="tpu", topology_name=topo_name)
    return topo, sharding.make_mesh(axes, devices=topo.devices)


def abstract_model(model_config, mesh, param_dtype: str | None = None):
    """The config's model (`models.build`'s: preset, dtype, remat, attention, attn_chunk,
    scan_layers) with abstract weights placed as `sharding.shard_model` places them on `mesh`;
    `param_dtype` (None: model.dtype) stores the weights in another dtype."""
    family = models.family_of_preset(model_config.preset)
    dtype = jnp.dtype(model_config.dtype)
    model = nnx.eval_shape(
        lambda: family.MODEL(
            family.PRESETS[model_config.preset],
            dtype=dtype,
            param_dtype=jnp.dtype(param_dtype or dtype),
            remat=model_config.remat,
            attention=model_config.attention,
            attn_chunk=model_config.attn_chunk,
            scan_layers=model_config.get("scan_layers", True),
            mesh=mesh,
            rngs=nnx.Rngs(0),
        )
    )
    for name, param in model.named_params().items():
        v = param.get_value()
        where = sharding.param_sharding(model.logical_axes(name), v.shape, mesh)
        param.set_value(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=where))
    return model


def batch_shapes(config, sizes: Sizes) -> dict:
    """The GRPO step's batch (t2t_jax/rl/step.py) as shapes: prompts [B, P], completions [B, C],
    advantages, the sampler's log-probs, old / reference log-probs where the config makes them."""
    b, p, c, g = sizes.rows, sizes.prompt, sizes.completion, config.grpo
    s = jax.ShapeDtypeStruct
    out = {
        "prompt_ids": s((b, p), jnp.int32),
        "prompt_mask": s((b, p), jnp.bool_),
        "completion_ids": s((b, c), jnp.int32),
        "completion_mask": s((b, c), jnp.bool_),
        "advantages": s((b,), jnp.float32),
        "sampler_logps": s((b, c), jnp.float32),
        "sampled": s((b,), jnp.bool_),
    }
    if g.old_logprobs == "sampler" or g.num_iterations > 1:
        out["old_logps"] = s((b, c), jnp.float32)
    if g.beta:
        out["ref_logps"] = s((b, c), jnp.float32)
    return out


def per_chip_bytes(tree) -> int:
    """Bytes of one chip's shards of abstract arrays (the largest shard of each)."""
    return int(
        sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree) if x.shape)
    )


def _timed(lowered):
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - start


# ---- the compiles ---------------------------------------------------------------------------
def compile_train(config, sizes: Sizes, mesh, report: Report):
    """The Trainer's update (see the module docstring) -> (compiled, seconds, row fields)."""
    model = abstract_model(config.model, mesh, report.param_dtype)
    trainer = Trainer(model, TrainSettings.from_config(config), loss="grpo", mesh=mesh)
    state = trainer.state_shapes()
    batch = trainer.batch_shapes(batch_shapes(config, sizes))
    compiled, seconds = _timed(trainer.lower(state, batch))
    ref = per_chip_bytes(state.params) if config.grpo.beta else 0  # (the reference: the params' copy)
    fields = dict(
        rows=sizes.rows,
        length=sizes.prompt + sizes.completion,
        micro_batches=config.train.micro_batches,
        micro_rows=sizes.rows // config.train.micro_batches,
        batch_keys=sorted(batch),
        remat=model.remat,
        attention=model.attention,
        attn_chunk=model.attn_chunk,
        share_prompts=bool(config.train.get("share_prompts", False)),
        state_bytes=per_chip_bytes(state),
        ref_model_bytes=ref,
    )
    return compiled, seconds, fields


def engine_of(config, sizes: Sizes, mesh, kv: str, report: Report):
    """(abstract model, the Engine the stage loop would build for it with cache layout `kv`)."""
    model = abstract_model(config.model, mesh, report.param_dtype)
    r = config.rollout
    pages = r.pages
    if kv == "paged" and sizes.kv_tokens:  # (whole pages, a null page per shard, a multiple of the shards)
        shards = Engine(model, STOP_IDS, 0, sizes.slots, r.chunk, kv, r.page_size).shards
        pages = -(-(-(-sizes.kv_tokens // r.page_size) + shards) // shards) * shards
    return model, Engine(model, STOP_IDS, 0, sizes.slots, r.chunk, kv, r.page_size, pages)


def replicated(mesh):
    return NamedSharding(mesh, PartitionSpec())


def _on(mesh, sh) -> bool:
    return isinstance(sh, NamedSharding) and sh.mesh.devices.tolist() == mesh.devices.tolist()


def slots_shapes(engine, state, mesh, length: int, width: int, pages: int):
    """The engine's free slots (`Engine._empty` compiled for the mesh: its shapes and
    shardings; a leaf off the mesh replicated)."""
    page_size = engine.page_size if engine.kv == "paged" else 0
    lowered = engine._empty.lower(
        engine.graphdef,
        state,
        engine.pad_id,
        slots=engine.slots,
        length=length,
        width=width,
        page_size=page_size,
        pages=pages,
    )
    out = lowered.compile().out_info
    rep = replicated(mesh)
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if _on(mesh, x.sharding) else rep), out
    )


def compile_decode(config, sizes: Sizes, mesh, report: Report, kv: str = "dense"):
    """The engine's decode chunk over every slot and its whole cache (see the module docstring)
    -> (compiled, seconds, row fields)."""
    model, engine = engine_of(config, sizes, mesh, kv, report)
    state = nnx.state(model)
    length = engine.slot_tokens(sizes.decode_tokens)
    pages = engine.pool_pages(length) if kv == "paged" else 0
    width = sizes.completion
    slots = slots_shapes(engine, state, mesh, length, width, pages)
    layers = engine._layers.lower(engine.graphdef, state).compile().out_info
    rep = replicated(mesh)
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rep)  # noqa: E731
    key = jax.eval_shape(lambda: jax.random.key(0))
    sampling = (
        jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep),
        sds((), jnp.float32),
        sds((), jnp.int32),
        sds((), jnp.float32),
    )
    args = (
        engine.graphdef,
        state,
        layers,
        slots,
        sds((sizes.slots,), jnp.int32),  # idx: every slot
        sampling,
        sds((len(STOP_IDS),), jnp.int32),
        sds((), jnp.int32),
        None,  # (rollouts are unconstrained)
    )
    window = slots.cache.columns()  # (the whole cache: the chunk runs in place)
    lowered = engine._decode.lower(*args, chunk=engine.chunk, window=window)
    compiled, seconds = _timed(lowered)
    fields = dict(
        rows=sizes.slots,
        length=1,
        chunk=engine.chunk,
        slot_tokens=length,
        kv=kv,
        attention=model.paged_kernel if kv == "paged" else "xla (decode step)",
        weights_copy_bytes=per_chip_bytes(layers),
    )
    if kv == "paged":
        pool = slots.cache.k[0]
        held = (pages - engine.shards) * engine.page_size  # (the pool's tokens, null pages aside)
        fields.update(
            page_size=engine.page_size,
            pages=pages,
            kv_tokens=held,
            cache_length=held // sizes.slots,  # (tokens a row holds on average when the pool is full)
            pool_bytes_per_chip=per_chip_bytes((pool,)) * 2 * len(slots.cache.k),
        )
    else:
        whole = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(slots.cache))
        fields.update(cache_length=length, cache_bytes=whole, cache_bytes_per_chip=per_chip_bytes(slots.cache))
    return compiled, seconds, fields


def compile_paged_decode(config, sizes: Sizes, mesh, report: Report):
    return compile_decode(config, sizes, mesh, report, kv="paged")


def compile_prefill(config, sizes: Sizes, mesh, report: Report):
    """The engine's prefill of one admission's prompts (rounded up to a power of two) into a
    cache of their length -> (compiled, seconds, row fields)."""
    model, engine = engine_of(config, sizes, mesh, "dense", report)
    g, p = next_pow2(sizes.prefill_prompts), sizes.prompt
    ids = jax.ShapeDtypeStruct((g, p), jnp.int32, sharding=replicated(mesh))  # (the engine's host ids)
    mask = jax.ShapeDtypeStruct((g, p), jnp.bool_, sharding=replicated(mesh))
    compiled, seconds = _timed(engine._prefill.lower(engine.graphdef, nnx.state(model), ids, mask))
    return compiled, seconds, dict(rows=g, length=p, cache_length=p, attention=model.attention)


COMPILERS = {
    "train": compile_train,
    "prefill": compile_prefill,
    "decode": compile_decode,
    "paged_decode": compile_paged_decode,
}


# ---- rows -----------------------------------------------------------------------------------
def _sig(x: float) -> float:
    return float(f"{x:.3g}")


def resident_bytes(config, mesh, report: Report) -> int:
    """Per chip, what stays in HBM beside the engine while it decodes: the optimizer state and
    the step (and the reference params when grpo.beta > 0); the params are the engine's own."""
    model = abstract_model(config.model, mesh, report.param_dtype)
    state = Trainer(model, TrainSettings.from_config(config), loss="grpo", mesh=mesh).state_shapes()
    params = per_chip_bytes(state.params)
    return per_chip_bytes(state) - params + (params if config.grpo.beta else 0)


def report_row(compiled, seconds, topo, topo_name, axes, model_config, report: Report, *, what, rows, length, **extra):
    """One JSON-able row (see the module docstring)."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    kind = topo.devices[0].device_kind
    hbm, peak_flops, bandwidth = CHIPS.get(kind, (None, None, None))
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    chips = len(topo.devices)
    tokens = rows * length
    config = models.family_of_preset(model_config.preset).PRESETS[model_config.preset]
    flops = model_flops(config, what, rows, length, extra.get("cache_length", 0))
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
        "preset": model_config.preset,
        "rows": rows,
        "length": length,
        **extra,
    }
    if peak_flops:
        step_s = flops / (chips * peak_flops * report.mfu)
        row.update(
            peak_flops_per_chip=peak_flops,
            mfu=report.mfu,
            step_s_at_mfu=_sig(step_s),
            tokens_per_s_at_mfu=_sig(tokens / step_s),
            memory_bound_s=_sig(mem.argument_size_in_bytes / bandwidth),
        )
        if report.tokens_per_s:
            row["mfu_needed"] = _sig(report.tokens_per_s * flops / tokens / (chips * peak_flops))
    return row


def compile_row(config, sizes: Sizes, what: str, topo_name: str, axes: dict, report: Report = Report()) -> dict:
    """Compile `what` for one (topology, mesh) -> its row (a failed compile is a row with
    `error`: one mesh failing says nothing of the others)."""
    try:
        topo, mesh = topology_mesh(topo_name, axes)
        compiled, seconds, extra = COMPILERS[what](config, sizes, mesh, report)
        row = report_row(compiled, seconds, topo, topo_name, axes, config.model, report, what=what, **extra)
        if what in ("decode", "paged_decode"):
            row["train_state_bytes"] = resident_bytes(config, mesh, report)
            row["fits_with_train_state"] = bool(
                row["hbm_bytes"] and row["peak_bytes"] + row["train_state_bytes"] <= row["hbm_bytes"]
            )
        return row
    except Exception as e:  # noqa: BLE001
        return {
            "topology": topo_name,
            "mesh": axes,
            "what": what,
            "fits": False,
            "error": f"{type(e).__name__}: {str(e)[:300]}",
        }


def meshes(n: int, batch: int | None = None) -> list[dict]:
    """Candidate meshes for n chips: FSDP x tensor (tensor 1..8) and data x FSDP, keeping
    only those whose batch axes (data x fsdp) divide `batch` rows (None: all)."""
    out = [{"fsdp": n // t, "tensor": t} if t > 1 else {"fsdp": n} for t in (1, 2, 4, 8) if n % t == 0]
    if n >= 16:
        out.append({"data": 2, "fsdp": n // 2})
    return [m for m in out if batch is None or batch % (m.get("data", 1) * m["fsdp"]) == 0]


def rows_of(what: str, sizes: Sizes) -> int | None:
    """The rows a mesh's batch axes must divide for `what`: the update's whole batch
    (`Trainer.shard` splits it evenly); None for the engine's steps, which run on the run's mesh
    whatever their rows (a paged pool splits over the axes that divide the slots)."""
    return sizes.rows if what == "train" else None


def mesh_overrides(axes: dict) -> str:
    full = {"data": axes.get("data", 1), "fsdp": axes.get("fsdp", 1), "tensor": axes.get("tensor", 1)}
    return " ".join(f"--config.mesh.{a}={v}" for a, v in full.items())


def with_micro_batches(config, m: int):
    out = copy.deepcopy(config)
    out.train.micro_batches = m
    return out


def suggest(config, sizes: Sizes, topo_name: str, candidates_for, emit, report: Report = Report()) -> dict:
    """The fewest micro-batches (1, 2, 4, ... of the update's rows) with a mesh that fits
    (`candidates_for(rows)`: the meshes for the whole batch), and the config overrides that
    select them; every compile (the whole update at that `train.micro_batches`) is emitted as a
    row on the way."""
    total, m = sizes.rows, 1
    while m <= total and total % m == 0:
        at = with_micro_batches(config, m)
        for axes in candidates_for(total):
            row = compile_row(at, sizes, "train", topo_name, axes, report)
            emit(row)
            if row["fits"]:
                return {
                    "suggest": topo_name,
                    "micro_batches": m,
                    "rows": total // m,
                    "mesh": axes,
                    "overrides": f"--config.train.micro_batches={m} {mesh_overrides(axes)}",
                }
        m *= 2
    return {"suggest": topo_name, "micro_batches": None, "note": f"no mesh fits even {total // (m // 2)} rows"}
