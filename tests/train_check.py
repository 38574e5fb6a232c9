"""Train-step equivalence checks run in subprocesses (fake CPU devices must be set before JAX
starts). Modes:

  sharded OUT                   8 fake devices: the sharded update == the single-device update,
                                also with shared prompts (groups of 2) against every row in full
  multihost PORT PID NPROC OUT  one of NPROC processes (2 fake devices each) of a
                                jax.distributed run over localhost: a fresh state is
                                checkpointed, then updates; process 0 writes the params
"""

import os
import sys

MODE = sys.argv[1]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + ("8" if MODE == "sharded" else "2")

import jax  # noqa: E402

if MODE == "multihost":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=int(sys.argv[4]), process_id=int(sys.argv[3]))

import ml_collections as mlc  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from t2t_jax import sharding  # noqa: E402
from t2t_jax.models import qwen3  # noqa: E402
from t2t_jax.rl.trainer import Trainer, TrainSettings  # noqa: E402

CONFIG = qwen3.Qwen3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
TRAIN = mlc.ConfigDict(
    dict(
        optim=dict(
            learning_rate=1e-2,
            warmup_steps=1,
            decay_steps=10,
            end_lr_fraction=0.1,
            b1=0.9,
            b2=0.99,
            weight_decay=0.01,
            max_grad_norm=1.0,
        ),
        train=dict(micro_batches=2, max_bad_steps=3, logprob_chunk=4),
        rollout=dict(temperature=1.0),
        grpo=dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, beta=0.0, group_size=2),
    )
)


def batch(rows=8, grouped=False):
    """`grouped`: rows 2i and 2i + 1 share a prompt (groups of grpo.group_size = 2)."""
    rng = np.random.default_rng(0)
    mask = np.ones((rows, 6), bool)
    mask[1 if not grouped else slice(2, 4), :3] = False
    comp = np.arange(5)[None] < rng.integers(1, 6, rows)[:, None]
    prompts = rng.integers(0, 64, (rows, 6)).astype(np.int32)
    if grouped:
        prompts = np.repeat(prompts[::2], 2, 0)
    return {
        "prompt_ids": prompts,
        "prompt_mask": mask,
        "completion_ids": rng.integers(0, 64, (rows, 5)).astype(np.int32),
        "completion_mask": comp,
        "advantages": rng.normal(size=rows).astype(np.float32),
        "old_logps": -rng.uniform(2, 6, (rows, 5)).astype(np.float32),
    }


def train(mesh, steps=3, share_prompts=False, grouped=False, checkpoint=None):
    model = qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0))
    if mesh is not None:
        sharding.shard_model(model, mesh)
    settings = TRAIN.copy_and_resolve_references()
    settings.train.share_prompts = share_prompts
    trainer = Trainer(model, TrainSettings.from_config(settings), loss="grpo", mesh=mesh)
    state = trainer.init()
    if checkpoint is not None:  # a fresh state spans every process: it can be checkpointed
        from t2t_jax.checkpoint import Checkpointer

        ckpt = Checkpointer(checkpoint)
        ckpt.save(1, {"state": state}, {"fresh": True})
        ckpt.close()
    data = trainer.shard(batch(grouped=grouped))  # (each process feeds the rows its devices hold)
    assert data["prompt_ids"].shape[0] == 8, data["prompt_ids"].shape  # the batch's rows, not 8 per process
    for _ in range(steps):
        state, metrics = trainer.update(state, data)
    return state, float(metrics["loss"])


def flat(params):
    return {
        jax.tree_util.keystr(k): np.asarray(jax.device_get(v)) for k, v in jax.tree_util.tree_leaves_with_path(params)
    }


def main():
    if MODE == "sharded":
        assert len(jax.devices()) == 8
        single, loss = train(None)
        ref = flat(single.params)
        for axes in ({"fsdp": 4, "tensor": 2}, {"data": 2, "fsdp": 4}, {"fsdp": -1}, {"tensor": 2, "data": 4}):
            state, l2 = train(sharding.make_mesh(axes))
            got = flat(jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), state.params))
            for k in ref:
                np.testing.assert_allclose(got[k], ref[k], atol=2e-5, err_msg=f"{axes} {k}")
            assert abs(l2 - loss) < 1e-5, (axes, l2, loss)
            print("ok", axes, flush=True)
        np.savez(sys.argv[2], **ref)
        full = flat(train(None, grouped=True)[0].params)
        state, _ = train(sharding.make_mesh({"data": 2, "fsdp": 4}), share_prompts=True, grouped=True)
        got = flat(jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), state.params))
        for k in full:
            np.testing.assert_allclose(got[k], full[k], atol=2e-5, err_msg=f"shared prompts {k}")
        print("ok shared prompts", flush=True)
        return
    pid, out = int(sys.argv[3]), sys.argv[5]  # (the process count is initialize's)
    mesh = sharding.make_mesh({"fsdp": -1})
    state, loss = train(mesh, checkpoint=os.path.join(os.path.dirname(os.path.abspath(out)), "fresh_state"))
    gathered = jax.jit(lambda p: p, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))(
        state.params
    )
    if pid == 0:
        np.savez(
            out,
            **{
                k: np.asarray(v.addressable_data(0))
                for k, v in ((jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_leaves_with_path(gathered))
            },
        )
        print("ok multihost", len(jax.devices()), "devices, loss", loss, flush=True)


if __name__ == "__main__":
    main()
