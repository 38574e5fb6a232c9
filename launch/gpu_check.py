"""First numbers on one GPU, in one run of at most a few minutes; `--smoke` runs the same code at
toy sizes on any backend (tests/test_gpu_check.py runs it on CPU).

  launch/gpu_check.sh                        # from the source tree, nothing installed (see below)
  python -m launch.gpu_check [--smoke] [--shapes=qwen3-0.6b,qwen3-4b] [--slots=64,256]

Prints one JSON object per line, each as soon as measured (a run cut short keeps its rows):
- `platform`: backend, device kind, jax / flax / transformers / torch versions.
- `attention`: the `cudnn` kernel (jax.nn.dot_product_attention, cuDNN's flash kernel; off GPU
  XLA's implementation of the same call) against our `xla` reference on a left-padded GQA batch
  in bf16: the largest |difference| of the outputs and of the q, k, v gradients at real tokens,
  relative to the reference's largest value, and `agree` (all below 2e-2).
- per shape, random weights in bf16: `engine_*` useful tokens/s of the continuous-batching Engine
  at each --slots (prompts of --prompt tokens, 2 x slots requests, lognormal budgets: median 64,
  sigma 1.3, at most --max_budget; skipped, with the cache's size, where the dense KV cache would
  not fit); `generate_*`: transformers `generate` (PyTorch, bf16, the same shape and budgets,
  batches of --slots each to its longest budget) as the baseline, the first batch only
  (`--generate_batches`), where torch is installed; `prefill_*` prompt tokens/s of a prefill
  into an empty cache; `grpo_update_*` tokens/s and MFU of the Trainer's GRPO update (dapo,
  AdamW, shared prompts, remat `full`) at 2 micro-batches of 8 x (prompt + max budget) tokens.
Each row's failure (out of memory, a missing kernel) is printed in the row as `error`.

What it needs beyond the GPU image's jax (0.11.x, CUDA), flax, optax, chex, orbax and
transformers: nothing else to install (absl-py, etils, rich, safetensors and numpy come with
those; transformers is imported only for the baseline); torch with CUDA for the `generate_*`
baseline only (without it that row says so). pyproject's `jax>=0.7,<0.11` pin binds `pip
install` only: run from the repository's root without installing (`PYTHONPATH=.`, what
launch/gpu_check.sh does); widen the pin once the tests pass on 0.11.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from t2t_jax import cli
from t2t_jax.models import attention, qwen3
from t2t_jax.perf import model_flops, peak_flops

FLAGS = flags.FLAGS
flags.DEFINE_bool("smoke", False, "Toy sizes (the `tiny` preset, short prompts and budgets): the CPU test.")
flags.DEFINE_list("shapes", ["qwen3-0.6b", "qwen3-4b"], "Presets (random weights, bf16).")
flags.DEFINE_list("slots", ["64", "256"], "Engine slots (rows in flight).")
flags.DEFINE_integer("prompt", 512, "Prompt tokens.", lower_bound=1, upper_bound=1 << 16)
flags.DEFINE_integer("max_budget", 2048, "The longest completion budget.", lower_bound=1, upper_bound=1 << 16)
flags.DEFINE_integer("micro_rows", 8, "Rows per micro-batch of the GRPO update.", lower_bound=1, upper_bound=4096)
flags.DEFINE_integer(
    "generate_batches", 1, "Batches of the generate baseline (0: none).", lower_bound=0, upper_bound=64
)
cli.one_of("shapes", qwen3.PRESETS)
cli.int_list("slots", 1, 4096)

SMOKE = dict(shapes=["tiny"], slots=["4"], prompt=16, max_budget=32, micro_rows=2)


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def guarded(name: str, fn, **info) -> None:
    """Emit fn()'s row under `name`, or the row with the error that stopped it."""
    try:
        emit({"name": name, **info, **fn()})
    except Exception as e:  # noqa: BLE001 (an out-of-memory or kernel error is a result here)
        emit({"name": name, **info, "error": f"{type(e).__name__}: {str(e)[:300]}"})


def timed(fn, repeats: int = 2) -> float:
    """Best seconds of `repeats` calls after one warm-up call (fn blocks until done)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def attention_check(smoke: bool) -> dict:
    """`cudnn` (on GPU) against `xla` on left-padded GQA: outputs and gradients at real tokens."""
    b, h, kv, t, e = (2, 4, 2, 16, 8) if smoke else (4, 16, 8, 512, 128)
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (b, h, t, e), jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, kv, t, e), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, kv, t, e), jnp.bfloat16)
    pads = np.linspace(0, t // 2, b).astype(int)  # row i: pads[i] left-pad tokens
    real = jnp.asarray(np.arange(t)[None] >= pads[:, None])
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & real[:, None, :] & real[:, :, None]
    cot = jax.random.normal(keys[3], (b, t, h * e), jnp.float32)
    flash = "cudnn" if jax.default_backend() == "gpu" else None

    def loss(kernel, q, k, v):
        out = kernel(q, k, v).astype(jnp.float32)
        return jnp.sum(jnp.where(real[..., None], out * cot, 0.0)), out

    ours = lambda q, k, v: attention.cudnn(q, k, v, mask, implementation=flash)  # noqa: E731
    ref = lambda q, k, v: attention.dense(q, k, v, mask)  # noqa: E731
    results = []
    for kernel in (ours, ref):
        fn = jax.jit(jax.value_and_grad(lambda q, k, v, f=kernel: loss(f, q, k, v), argnums=(0, 1, 2), has_aux=True))
        (_, out), grads = fn(q, k, v)
        results.append((jnp.where(real[..., None], out, 0.0), *grads))

    def rel(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

    diffs = {n: rel(a, r) for n, a, r in zip(("out", "dq", "dk", "dv"), *results)}
    return {
        "implementation": flash or "xla (jax.nn.dot_product_attention, no cuDNN off GPU)",
        "shape": {"batch": b, "heads": h, "kv_heads": kv, "tokens": t, "head_dim": e, "left_pad": pads.tolist()},
        **{f"rel_diff_{n}": round(d, 5) for n, d in diffs.items()},
        "agree": all(d < 2e-2 for d in diffs.values()),
    }


def requests(config, slots: int):
    """2 x slots prompts and their lognormal budgets (the heavy-tailed mix of launch.bench_model)."""
    from launch.bench_workloads import lognormal_budgets

    budgets = lognormal_budgets(64 * FLAGS.max_budget / 2048, 1.3, FLAGS.max_budget, 2 * slots)
    ids = np.random.default_rng(0).integers(1, config.vocab_size, (len(budgets), FLAGS.prompt))
    return ids, np.ones_like(ids, bool), budgets


def cache_gib(config, slots: int) -> float:
    c = config
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2  # k and v, bf16
    return slots * (FLAGS.prompt + FLAGS.max_budget) * per_token / 2**30


def free_gib() -> float | None:
    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    return None if limit is None else (limit - stats.get("bytes_in_use", 0)) / 2**30


def engine_row(model, config, slots: int) -> dict:
    from t2t_jax.sampling import Engine

    need, free = cache_gib(config, slots), free_gib()
    info = {"slots": slots, "kv_cache_gib": round(need, 2)}
    if free is not None and need > 0.8 * free:
        return info | {"skipped": f"the dense KV cache needs {need:.1f} GiB of the {free:.1f} GiB free"}
    ids, mask, budgets = requests(config, slots)
    engine = Engine(model, [], pad_id=0, slots=slots, chunk=32, kv="dense")
    seconds = timed(lambda: engine.generate(ids, mask, budgets), repeats=1)
    useful = int(budgets.sum())
    return info | {
        "requests": len(budgets),
        "useful_tokens": useful,
        "useful_tokens_per_s": round(useful / seconds, 1),
        "seconds": round(seconds, 2),
        "budget_median": float(np.median(budgets)),
        "budget_max": int(budgets.max()),
    }


def generate_row(config, slots: int) -> dict:
    """transformers `generate` (PyTorch bf16, random weights of the same shape) on the first
    --generate_batches batches of the engine's requests, each to its longest budget."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return {"slots": slots, "skipped": f"torch is not installed ({e})"}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        hf = transformers.Qwen3Config(**config.to_hf())
        model = transformers.Qwen3ForCausalLM._from_config(hf, dtype=torch.bfloat16).eval()
    ids, mask, budgets = requests(config, slots)
    batches = [slice(i, i + slots) for i in range(0, len(budgets), slots)][: FLAGS.generate_batches]

    def run(cap: int | None = None):
        for part in batches:
            new = int(budgets[part].max()) if cap is None else cap
            with torch.no_grad():
                model.generate(
                    input_ids=torch.tensor(ids[part], device=device),
                    attention_mask=torch.tensor(mask[part].astype(np.int64), device=device),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                )
            if device == "cuda":
                torch.cuda.synchronize()

    run(cap=4)  # (warm-up: CUDA and cuBLAS start; eager PyTorch compiles nothing)
    t = time.perf_counter()
    run()
    seconds = time.perf_counter() - t
    useful = int(sum(budgets[p].sum() for p in batches))
    return {
        "slots": slots,
        "baseline": "transformers_generate_greedy",
        "torch": torch.__version__,
        "device": device,
        "requests": sum(len(budgets[p]) for p in batches),
        "useful_tokens_per_s": round(useful / seconds, 1),
        "seconds": round(seconds, 2),
    }


def prefill_row(model, config) -> dict:
    rows = 8
    ids = jnp.asarray(np.random.default_rng(1).integers(1, config.vocab_size, (rows, FLAGS.prompt)))
    mask = jnp.ones_like(ids, bool)

    @nnx.jit
    def prefill(model, ids, mask):
        cache = model.init_cache(rows, FLAGS.prompt + FLAGS.max_budget)
        logits, cache = model(ids, mask, cache, prefill=True)
        return logits[:, -1], cache

    seconds = timed(lambda: jax.block_until_ready(prefill(model, ids, mask)))
    return {"rows": rows, "prompt": FLAGS.prompt, "tokens_per_s": round(rows * FLAGS.prompt / seconds, 1)}


def update_row(model, config) -> dict:
    from launch.bench_workloads import grpo_settings
    from t2t_jax.rl.trainer import Trainer

    m, g = 2, FLAGS.micro_rows
    rows, p, c = m * g, FLAGS.prompt, FLAGS.max_budget
    rng = np.random.default_rng(2)
    batch = {
        "prompt_ids": np.repeat(rng.integers(1, config.vocab_size, (1, p)), rows, 0).astype(np.int32),
        "prompt_mask": np.ones((rows, p), bool),
        "completion_ids": rng.integers(1, config.vocab_size, (rows, c)).astype(np.int32),
        "completion_mask": np.ones((rows, c), bool),
        "advantages": rng.normal(size=rows).astype(np.float32),
    }
    settings = grpo_settings(share_prompts=True, group_size=g)
    trainer = Trainer(model, dataclasses.replace(settings, micro_batches=m))
    state = [trainer.init()]
    arrays = trainer.shard(batch)

    def step():
        state[0], metrics = trainer.update(state[0], arrays)
        jax.block_until_ready(metrics["loss"])

    seconds = timed(step, repeats=1)
    tokens = rows * (p + c)
    peak = peak_flops(jax.devices()[0])
    flops = model_flops(config, "train", rows, p + c)
    return {
        "micro_batches": m,
        "micro_rows": g,
        "tokens_per_row": p + c,
        "tokens_per_s": round(tokens / seconds, 1),
        "seconds": round(seconds, 3),
        "mfu": round(flops / seconds / peak, 4) if peak else None,
    }


def main(argv):
    del argv
    if FLAGS.smoke:
        for k, v in SMOKE.items():
            setattr(FLAGS, k, v)
    versions = {}
    for name in ("flax", "optax", "transformers", "torch"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    device = jax.devices()[0]
    emit(
        {
            "name": "platform",
            "backend": jax.default_backend(),
            "device": getattr(device, "device_kind", str(device)),
            "devices": jax.device_count(),
            "jax": jax.__version__,
            **versions,
            "smoke": FLAGS.smoke,
        }
    )
    guarded("attention", lambda: attention_check(FLAGS.smoke))
    for shape in FLAGS.shapes:
        config = qwen3.PRESETS[shape]
        remat = "none" if FLAGS.smoke else "full"
        model = qwen3.Qwen3(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, remat=remat, rngs=nnx.Rngs(0))
        info = {"shape": shape, "params": qwen3.num_params(config), "prompt": FLAGS.prompt}
        slots = [int(s) for s in FLAGS.slots]
        for n in slots:
            guarded(f"engine_{shape}", lambda n=n: engine_row(model, config, n), **info)
        if FLAGS.generate_batches:
            guarded(f"generate_{shape}", lambda: generate_row(config, slots[0]), **info)
        guarded(f"prefill_{shape}", lambda: prefill_row(model, config), **info)
        guarded(f"grpo_update_{shape}", lambda: update_row(model, config), **info)


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    cli.run(main)
