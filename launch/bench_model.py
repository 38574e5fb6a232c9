"""Benchmark the Flax Qwen3 against the same weights in transformers (PyTorch CPU), one run.

  python -m launch.bench_model [--shapes=tiny,100m] [--batch=4] [--length=128]
      [--decode_batches=1,16,64] [--prompt=32] [--new_tokens=32] [--shared_groups=8] [--group_size=8]
      [--benches=train,grpo,shared,decode,engine] [--noscan_layers] [--slots=64] [--chunk=32] [--requests=256]

Prints one JSON object per line: `name`, `batch`, `ours_per_s` (tokens/s), `baseline`,
`baseline_per_s`, `ratio`. Measured on the same weights in one run: forward + backward of the
next-token cross-entropy (`train_step_*`); a whole GRPO update (`grpo_update_*`: our jitted
Trainer step, prompt + completion of --length tokens, chunked log-probs, the clipped dapo loss
and AdamW) against a PyTorch forward + backward of the same batch; and greedy decoding with a KV cache
(`decode_*`: our Sampler against `transformers` `generate`, both producing exactly
--new_tokens tokens per row). `grpo_shared_prompts_*` compares two of ours: the GRPO update
with each group's prompt run once (`train.share_prompts`, the default) against every row run in
full, on --shared_groups x --group_size rows (baseline `ours_every_row_in_full`). Each pair is
timed alternately (`paired`), best of --repeats. `engine_*` (`--benches=engine`): useful tokens/s
of the continuous-batching Engine against the static Sampler (baseline `static_sampler`) on
request mixes whose budgets follow the embedded default's lengths and a heavy-tailed lognormal.
Like every launcher it restarts itself with glibc's huge-page malloc tunable
(t2t_jax/hostenv.py), which both frameworks then run under.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from launch.bench_workloads import grpo_settings, lognormal_budgets
from t2t_jax import cli
from t2t_jax.models import qwen3

FLAGS = flags.FLAGS
flags.DEFINE_list("shapes", ["tiny", "100m"], "Presets to measure.")
flags.DEFINE_list("benches", ["train", "grpo", "shared", "decode"], "Which measurements to run.")
flags.DEFINE_integer("batch", 4, "Sequences per step.", lower_bound=1, upper_bound=4096)
flags.DEFINE_integer("length", 128, "Tokens per sequence.", lower_bound=2, upper_bound=1 << 17)
flags.DEFINE_integer("repeats", 3, "Timed repeats (best kept).", lower_bound=1, upper_bound=100)
flags.DEFINE_list("decode_batches", ["1", "16", "64"], "Batch sizes for decoding.")
flags.DEFINE_integer("prompt", 32, "Prompt tokens for decoding.", lower_bound=1, upper_bound=1 << 17)
flags.DEFINE_integer("new_tokens", 32, "New tokens per row for decoding.", lower_bound=1, upper_bound=1 << 17)
flags.DEFINE_integer(
    "shared_groups", 8, "Prompts (groups) per GRPO batch of the shared-prompt row.", lower_bound=1, upper_bound=4096
)
flags.DEFINE_integer("group_size", 8, "Samples per prompt of the shared-prompt row.", lower_bound=1, upper_bound=4096)
flags.DEFINE_integer(
    "slots", 64, "Rows in flight of the engine bench (the static side's batch).", lower_bound=1, upper_bound=4096
)
flags.DEFINE_integer("chunk", 32, "Decode steps per engine call.", lower_bound=1, upper_bound=4096)
flags.DEFINE_integer("requests", 256, "Requests per mix of the engine bench.", lower_bound=1, upper_bound=100_000)
flags.DEFINE_list("mixes", ["default_lengths", "heavy_tailed"], "Request mixes of the engine bench.")
flags.DEFINE_string("kv", "dense", "The engine bench's cache: dense or paged (rollout.kv; off TPU paged gathers).")
flags.DEFINE_bool("scan_layers", True, "Our layers under one lax.scan (False: unrolled), see Qwen3.")
cli.one_of("shapes", qwen3.PRESETS)
cli.one_of("benches", ("train", "grpo", "shared", "decode", "engine"))
cli.one_of("mixes", ("default_lengths", "heavy_tailed"))
cli.one_of("kv", ("auto", "dense", "paged"))
cli.int_list("decode_batches", 1, 4096)


def paired(ours, baseline, repeats):
    """Best-of-`repeats` seconds of two callables, timed alternately after one warm-up call of
    each, so that a slow spell of a shared machine hits both sides alike."""
    ours(), baseline()
    times = ([], [])
    for _ in range(repeats):
        for fn, out in zip((ours, baseline), times):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return min(times[0]), min(times[1])


def emit(name, batch, ours, baseline, base, **extra):
    print(
        json.dumps(
            {
                "name": name,
                "batch": batch,
                "ours_per_s": round(ours, 1),
                "baseline": baseline,
                "baseline_per_s": round(base, 1),
                "ratio": round(ours / base, 2),
                **extra,
            }
        ),
        flush=True,
    )


def loss_fn(model, ids):
    logits = model(ids[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()


def bench_train(shape, batch, length):
    import torch
    import transformers

    config = qwen3.PRESETS[shape]
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, length + 1))
    with tempfile.TemporaryDirectory() as tmp:
        qwen3.save_pretrained(qwen3.Qwen3(config, rngs=nnx.Rngs(0)), tmp)
        model = qwen3.from_pretrained(tmp, scan_layers=FLAGS.scan_layers)
        ref = transformers.Qwen3ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa").train()
    step = nnx.jit(lambda m, x: nnx.value_and_grad(loss_fn)(m, x))
    x = jnp.asarray(ids)
    t_ids = torch.tensor(ids)

    def torch_step():
        ref.zero_grad(set_to_none=True)
        out = ref(input_ids=t_ids[:, :-1], labels=None).logits
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), t_ids[:, 1:].reshape(-1))
        loss.backward()

    ours, base = paired(lambda: jax.block_until_ready(step(model, x)), torch_step, FLAGS.repeats)
    emit(
        f"train_step_{shape}",
        batch,
        batch * length / ours,
        "transformers_pytorch_cpu",
        batch * length / base,
        length=length,
        params=qwen3.num_params(config),
        torch_threads=torch.get_num_threads(),
        scan_layers=FLAGS.scan_layers,
    )


def bench_grpo(shape, batch, length):
    """Our full GRPO update vs a transformers forward + backward (no optimizer) on the batch."""
    import torch
    import transformers

    from t2t_jax.rl.trainer import Trainer

    config = qwen3.PRESETS[shape]
    rng = np.random.default_rng(0)
    p, c = length // 2, length - length // 2
    data = {
        "prompt_ids": rng.integers(0, config.vocab_size, (batch, p)).astype(np.int32),
        "prompt_mask": np.ones((batch, p), bool),
        "completion_ids": rng.integers(0, config.vocab_size, (batch, c)).astype(np.int32),
        "completion_mask": np.ones((batch, c), bool),
        "advantages": rng.normal(size=batch).astype(np.float32),
        "old_logps": -rng.uniform(5, 10, (batch, c)).astype(np.float32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        qwen3.save_pretrained(qwen3.Qwen3(config, rngs=nnx.Rngs(0)), tmp)
        trainer = Trainer(qwen3.from_pretrained(tmp, scan_layers=FLAGS.scan_layers), grpo_settings())
        ref = transformers.Qwen3ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa").train()
    state = [trainer.init()]
    batch_arrays = trainer.shard(data)

    def ours_step():
        state[0], metrics = trainer.update(state[0], batch_arrays)
        jax.block_until_ready(metrics["loss"])

    t_ids = torch.tensor(np.concatenate([data["prompt_ids"], data["completion_ids"]], 1), dtype=torch.long)

    def torch_step():
        ref.zero_grad(set_to_none=True)
        logits = ref(input_ids=t_ids).logits[:, p - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, t_ids[:, p:, None])[..., 0]
        (-logp.mean()).backward()

    ours, base = paired(ours_step, torch_step, FLAGS.repeats)
    emit(
        f"grpo_update_{shape}",
        batch,
        batch * length / ours,
        "transformers_pytorch_cpu_fwd_bwd",
        batch * length / base,
        length=length,
        scan_layers=FLAGS.scan_layers,
    )


def bench_shared(shape):
    """Our GRPO update with each group's prompt run once (`train.share_prompts`) vs every row
    run in full, on --shared_groups groups of --group_size samples: prompts of --length
    tokens (left-padded by up to a quarter), completions of --length / 2 (ending at random)."""
    from t2t_jax.rl.trainer import Trainer

    config, groups, g = qwen3.PRESETS[shape], FLAGS.shared_groups, FLAGS.group_size
    rng = np.random.default_rng(0)
    p, c, b = FLAGS.length, FLAGS.length // 2, FLAGS.shared_groups * FLAGS.group_size
    prompt_mask = np.arange(p)[None] >= rng.integers(0, p // 4, groups)[:, None]
    data = {
        "prompt_ids": np.repeat(rng.integers(0, config.vocab_size, (groups, p)), g, 0).astype(np.int32),
        "prompt_mask": np.repeat(prompt_mask, g, 0),
        "completion_ids": rng.integers(0, config.vocab_size, (b, c)).astype(np.int32),
        "completion_mask": np.arange(c)[None] < rng.integers(c // 4, c + 1, b)[:, None],
        "advantages": rng.normal(size=b).astype(np.float32),
    }
    model = qwen3.Qwen3(config, scan_layers=FLAGS.scan_layers, rngs=nnx.Rngs(0))
    shared, full = Trainer(model, grpo_settings(True, g)), Trainer(model, grpo_settings(False, g))
    arrays = shared.shard(data)
    states = {"shared": shared.init(), "full": full.init()}

    def step(name, trainer):
        def run():
            states[name], metrics = trainer.update(states[name], arrays)
            jax.block_until_ready(metrics["loss"])

        return run

    ours, base = paired(step("shared", shared), step("full", full), FLAGS.repeats)
    tokens = b * (p + c)
    emit(
        f"grpo_shared_prompts_{shape}",
        b,
        tokens / ours,
        "ours_every_row_in_full",
        tokens / base,
        groups=groups,
        group_size=g,
        prompt=p,
        completion=c,
    )


def bench_decode(shape):
    import torch
    import transformers

    from t2t_jax.sampling import Sampler

    config = qwen3.PRESETS[shape]
    with tempfile.TemporaryDirectory() as tmp:
        qwen3.save_pretrained(qwen3.Qwen3(config, rngs=nnx.Rngs(0)), tmp)
        model = qwen3.from_pretrained(tmp)
        ref = transformers.Qwen3ForCausalLM.from_pretrained(tmp).eval()
    sampler = Sampler(model, stop_ids=[], pad_id=0)
    for batch in (int(b) for b in FLAGS.decode_batches):
        ids = np.random.default_rng(batch).integers(1, config.vocab_size, (batch, FLAGS.prompt))
        mask = np.ones_like(ids, bool)
        new = FLAGS.new_tokens
        t_ids, t_mask = torch.tensor(ids), torch.tensor(mask.astype(np.int64))

        def hf():
            with torch.no_grad():
                ref.generate(
                    input_ids=t_ids,
                    attention_mask=t_mask,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                    use_cache=True,
                )

        ours, base = paired(
            lambda: jax.block_until_ready(sampler.generate(ids, mask, max_new_tokens=new).tokens), hf, FLAGS.repeats
        )
        emit(
            f"decode_{shape}",
            batch,
            batch * new / ours,
            "transformers_generate_greedy",
            batch * new / base,
            prompt=FLAGS.prompt,
            new_tokens=new,
        )


ENGINE_MIXES = {  # name -> lognormal budgets (median, sigma, cap)
    "default_lengths": (20, 0.5, 64),  # the embedded default's completions: mean ~22 of at most 64 tokens
    "heavy_tailed": (64, 1.3, 2048),  # p99 = 64 e^(2.33 x 1.3) ~ 21x the median
}


def bench_engine(shape):
    """Useful tokens/s (tokens of unfinished rows) of the continuous-batching Engine against the
    static Sampler on the same requests, both with --slots rows in flight: the static side runs
    the requests in batches of --slots, each to its longest budget; the engine honours each
    row's budget. Random weights and no stop ids, so the budgets set the lengths."""
    from t2t_jax.sampling import Engine, Sampler

    config = qwen3.PRESETS[shape]
    model = qwen3.Qwen3(config, rngs=nnx.Rngs(0))
    slots = FLAGS.slots
    sampler = Sampler(model, [], pad_id=0)
    engine = Engine(model, [], pad_id=0, slots=slots, chunk=FLAGS.chunk, kv=FLAGS.kv)
    unknown = sorted(set(FLAGS.mixes) - set(ENGINE_MIXES))
    if unknown:
        raise app.UsageError(f"--mixes: {unknown} not among {sorted(ENGINE_MIXES)}")
    for mix, (median, sigma, cap) in ENGINE_MIXES.items():
        if mix not in FLAGS.mixes:
            continue
        rng = np.random.default_rng(0)
        budgets = lognormal_budgets(median, sigma, cap, FLAGS.requests)
        ids = rng.integers(1, config.vocab_size, (len(budgets), FLAGS.prompt))
        mask = np.ones_like(ids, bool)

        def static():
            for i in range(0, len(budgets), slots):
                part = slice(i, i + slots)
                jax.block_until_ready(sampler.generate(ids[part], mask[part], int(budgets[part].max())).tokens)

        ours, base = paired(lambda: engine.generate(ids, mask, budgets), static, FLAGS.repeats)
        useful = int(budgets.sum())
        emit(
            f"engine_{mix}_{shape}",
            slots,
            useful / ours,
            "static_sampler",
            useful / base,
            requests=len(budgets),
            chunk=FLAGS.chunk,
            kv=FLAGS.kv,
            budget_median=float(np.median(budgets)),
            budget_p99=float(np.percentile(budgets, 99)),
            p99_over_median=round(float(np.percentile(budgets, 99) / np.median(budgets)), 1),
            budget_max=int(budgets.max()),
            useful_tokens=useful,
        )


def main(argv):
    del argv
    print(
        json.dumps(
            {
                "name": "platform",
                "backend": jax.default_backend(),
                "cpus": os.cpu_count(),
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
            }
        ),
        flush=True,
    )
    benches = {
        "train": lambda s: bench_train(s, FLAGS.batch, FLAGS.length),
        "grpo": lambda s: bench_grpo(s, FLAGS.batch, FLAGS.length),
        "shared": bench_shared,
        "decode": bench_decode,
        "engine": bench_engine,
    }
    unknown = set(FLAGS.benches) - set(benches)
    if unknown:
        raise app.UsageError(f"--benches: unknown {sorted(unknown)}; known: {sorted(benches)}")
    for shape in FLAGS.shapes:
        for name in FLAGS.benches:
            benches[name](shape)


if __name__ == "__main__":
    cli.run(main)
