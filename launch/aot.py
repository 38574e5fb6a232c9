"""Compile the run's own steps ahead of time for TPU topologies, from a CPU machine (the
compiles: t2t_jax/aot.py).

  pip install -e ".[tpu]"
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot --config=configs/qwen3_4b.py --suggest
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot --config=configs/qwen3_4b.py \
      --what=train,prefill,decode,paged_decode [--topologies=v5e:4x4,v5p:4x4x4] [--meshes=fsdp=16,fsdp=8xtensor=2]
  TPU_WORKER_HOSTNAMES=localhost python -m launch.aot [--preset=qwen3-4b] [--batch=64] [--length=2048] ...

With --config the model, the Trainer's update (train.micro_batches, the GRPO loss, the
optimizer), the engine (rollout.slots, chunk, page_size, pages) and the shapes come from a
stage-loop config: the update's batch is grpo.prompts x group_size rows of --prompt_tokens (the
prompt bucket) + rollout.max_new_tokens tokens, the decode step runs the engine's slots over the
cache it allocates for those rows, the prefill one admission's prompts (slots / group_size).
Config overrides apply as in launch.main (`--config.train.micro_batches=4`). Without --config a
default config (t2t_jax/config/defaults.py) takes the flags below: --batch rows in groups of
--samples, --length tokens (a prompt of min(--prompt_tokens, --length / 2)), --micro_batches, the
decode step at --decode_batch slots of --decode_length tokens.

What is compiled (t2t_jax/aot.py): train (the Trainer's jitted GRPO update), prefill (the
engine's), decode and paged_decode (the engine's decode chunk, dense or paged). Parameters are
abstract (`jax.ShapeDtypeStruct` with shardings): no weights needed. The model's `attention=auto`
resolves for the topology (splash on TPU; the paged cache then uses the Pallas `paged_attention`
kernel where the head size suits it). Splash and paged_attention run as Pallas custom calls whose
FLOPs the cost analysis does not count: `flops` then covers the rest of the step (`model_flops`
counts attention analytically).

`--suggest` searches train.micro_batches (1, 2, 4, ...) x meshes for the fewest micro-batches
that fit each topology and prints the config overrides (`--config.train.micro_batches=...
--config.mesh.*=...`).

Prints one JSON object per line per (topology, mesh, what): `fits`, per-chip `peak_bytes`,
`argument_bytes`, `output_bytes`, `temp_bytes`, `alias_bytes` (`memory_analysis()`), `flops` per
chip (`cost_analysis()`), the chip's `hbm_bytes`, the step's `tokens` and `model_flops`, and time
estimates from the chip's peak: `step_s_at_mfu` / `tokens_per_s_at_mfu` at --mfu, the
`memory_bound_s` floor (arguments read once at HBM bandwidth) and, with --tokens_per_s, the
`mfu_needed` to reach it.
"""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # (no chips here: compiles may run side by side)

from absl import app, flags  # noqa: E402

from t2t_jax import aot, cli  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "qwen3-4b", "Model preset (without --config).")
flags.DEFINE_list("topologies", ["v5e:4x4", "v5p:4x4x4", "v4:4x4x8"], "TPU topologies.")
flags.DEFINE_integer("batch", 64, "The update's rows (without --config): 8 prompts x groups of 8.", lower_bound=1)
flags.DEFINE_integer("length", 2048, "Tokens per row of the update (prompt + completion).", lower_bound=2)
flags.DEFINE_integer("micro_batches", 1, "train.micro_batches (without --config).", lower_bound=1)
flags.DEFINE_string("remat", "full", "Remat policy: none, dots, full.")
flags.DEFINE_string("param_dtype", "float32", "Weight dtype without --config (compute is bf16; a config: model.dtype).")
flags.DEFINE_integer("logits_chunk", 256, "train.logprob_chunk: tokens per logits chunk.", lower_bound=1)
flags.DEFINE_integer("attn_chunk", 0, "Query block of the chunked attention kernel (0: full attention).", lower_bound=0)
flags.DEFINE_string(
    "attention", "auto", "Attention kernel: auto (splash on TPU), xla, chunked (with --attn_chunk), splash."
)
flags.DEFINE_list(
    "what",
    ["train"],
    "What to compile: train (the Trainer's update), prefill, decode (the engine's decode chunk, dense cache), "
    "paged_decode (paged cache).",
)
flags.DEFINE_integer("decode_batch", 64, "Decode slots (rollout.slots, without --config).", lower_bound=1)
flags.DEFINE_integer("decode_length", 8192, "Tokens a slot's rows need (without --config).", lower_bound=1)
flags.DEFINE_integer("chunk", 32, "rollout.chunk: decode steps per call (without --config).", lower_bound=1)
flags.DEFINE_integer("page_size", 64, "paged_decode: tokens per page (without --config).", lower_bound=1)
flags.DEFINE_integer(
    "kv_tokens", 0, "paged_decode: tokens the page pool holds over all slots (0: rollout.pages).", lower_bound=0
)
_CONFIG = cli.DEFINE_config_file(
    "config", None, "A stage-loop config (e.g. configs/qwen3_4b.py): its model, update, engine and shapes."
)
flags.DEFINE_list(
    "meshes", [], "Only these meshes, e.g. fsdp=16,fsdp=8xtensor=2 ('x' joins axes; default: every candidate)."
)
flags.DEFINE_integer("prompt_tokens", 512, "The longest prompt (its length bucket), in tokens.", lower_bound=1)
flags.DEFINE_integer("samples", 8, "Samples per prompt (grpo.group_size, without --config).", lower_bound=1)
flags.DEFINE_float(
    "mfu", 0.4, "Model-FLOPs utilisation for the step-time estimate (`step_s_at_mfu`).", lower_bound=0.01
)
flags.DEFINE_float(
    "tokens_per_s", 0, "A target throughput (global tokens/s): each row reports the MFU it needs.", lower_bound=0
)
flags.DEFINE_bool(
    "suggest", False, "Search micro-batch counts (1, 2, 4, ...) x meshes for the fewest that fit each topology."
)


def flags_config():
    """A default config carrying the flags' model, update and engine (no --config)."""
    from t2t_jax.config.defaults import base

    c = base()
    group = FLAGS.samples if FLAGS.batch % FLAGS.samples == 0 else 1
    prompt = min(FLAGS.prompt_tokens, FLAGS.length // 2)
    c.model.update(
        preset=FLAGS.preset, dtype="bfloat16", remat=FLAGS.remat, attention=FLAGS.attention, attn_chunk=FLAGS.attn_chunk
    )
    c.grpo.update(prompts=FLAGS.batch // group, group_size=group)
    c.rollout.update(max_new_tokens=FLAGS.length - prompt, slots=FLAGS.decode_batch, chunk=FLAGS.chunk)
    c.rollout.update(page_size=FLAGS.page_size)
    c.train.update(micro_batches=FLAGS.micro_batches, logprob_chunk=FLAGS.logits_chunk, share_prompts=False)
    sizes = aot.Sizes.from_config(c, prompt)
    sizes = dataclasses.replace(
        sizes,
        slots=FLAGS.decode_batch,
        decode_tokens=FLAGS.decode_length,
        prefill_prompts=max(1, FLAGS.decode_batch // FLAGS.samples),
    )
    return c, sizes


def implied(config, sizes: aot.Sizes) -> dict:
    """What a config implies (printed first with --config)."""
    m, t, r = config.model, config.train, config.rollout
    return {
        "preset": m.preset,
        "param_dtype": m.dtype,
        "remat": m.remat,
        "attention": m.attention,
        "attn_chunk": m.attn_chunk,
        "rollout_rows": sizes.rows,
        "micro_batches": t.micro_batches,
        "batch": sizes.rows // t.micro_batches,  # (rows per micro-batch)
        "length": sizes.prompt + sizes.completion,
        "decode_batch": sizes.slots,
        "decode_length": sizes.decode_tokens,
        "samples": config.grpo.group_size,
        "chunk": r.chunk,
        "page_size": r.page_size,
        "pages": r.pages,
        "beta": config.grpo.beta,
    }


def main(argv):
    del argv
    from jax.experimental import topologies

    if _CONFIG.value is not None:
        config = _CONFIG.value
        sizes = aot.Sizes.from_config(config, FLAGS.prompt_tokens)
        t = config.train.micro_batches
        if sizes.rows % t:
            raise app.UsageError(f"train.micro_batches: {t} does not divide the batch of {sizes.rows} rows")
        print(json.dumps({"from_config": implied(config, sizes)}), flush=True)
        report = aot.Report(mfu=FLAGS.mfu, tokens_per_s=FLAGS.tokens_per_s)
    else:
        config, sizes = flags_config()
        report = aot.Report(mfu=FLAGS.mfu, tokens_per_s=FLAGS.tokens_per_s, param_dtype=FLAGS.param_dtype)
    if FLAGS.kv_tokens:
        sizes = dataclasses.replace(sizes, kv_tokens=FLAGS.kv_tokens)
    unknown = sorted(set(FLAGS.what) - set(aot.COMPILERS))
    if unknown:
        raise app.UsageError(f"--what: {unknown} not among {sorted(aot.COMPILERS)}")
    wanted = [{a: int(v) for a, v in (x.split("=") for x in m.split("x"))} for m in FLAGS.meshes]
    emit = lambda row: print(json.dumps(row), flush=True)  # noqa: E731
    for topo_name in FLAGS.topologies:
        n = len(topologies.get_topology_desc(platform="tpu", topology_name=topo_name).devices)

        def candidates_for(rows):
            return [m for m in aot.meshes(n, rows) if not wanted or m in wanted]

        for what in FLAGS.what:
            if what == "train" and FLAGS.suggest:
                emit(aot.suggest(config, sizes, topo_name, candidates_for, emit, report))
                continue
            rows = aot.rows_of(what, sizes)
            for axes in candidates_for(rows):
                emit(aot.compile_row(config, sizes, what, topo_name, axes, report))
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
