"""Ahead-of-time TPU compiles from this CPU machine (`launch.aot` over t2t_jax/aot.py, needs
libtpu: the `tpu` extra, which CI installs): the splash kernel lowers for real TPU chips (Mosaic,
not interpret mode) under a sharded mesh in the update and the prefill, the train row is the
Trainer's own GRPO update, the decode rows the engine's decode chunk, the time estimates follow
from the model FLOPs, `--suggest` names its overrides, and the paper config's GRPO update fits a
v5e and a v5p mesh."""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install -e '.[tpu]')"
)


def aot(*flags, timeout=900):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_WORKER_HOSTNAMES": "localhost"}
    out = subprocess.run(
        [sys.executable, "-m", "launch.aot", *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@needs_libtpu
@pytest.mark.slow  # (about a minute: three Pallas lowerings)
def test_splash_train_prefill_and_decode_steps_compile_for_a_sharded_v5e():
    rows = aot(
        "--preset=tiny",
        "--topologies=v5e:2x2",
        "--attention=splash",
        "--batch=8",
        "--length=200",
        "--what=train,prefill,decode",
        "--decode_batch=16",
        "--samples=4",
        "--prompt_tokens=64",
        "--decode_length=256",
        "--meshes=fsdp=4,fsdp=2xtensor=2",
        "--tokens_per_s=1e6",
    )
    meshes = [{"fsdp": 4}, {"fsdp": 2, "tensor": 2}]
    assert [(r["what"], r["mesh"]) for r in rows] == [(w, m) for w in ("train", "prefill", "decode") for m in meshes]
    assert all(r["fits"] and "error" not in r for r in rows), rows
    # (the engine's decode chunk runs in its donated slots, aliased; on fsdp=4 with no temporaries at all)
    assert all(r["temp_bytes"] > 0 if r["what"] != "decode" else r["alias_bytes"] > 0 for r in rows), rows
    by = {(r["what"], r["mesh"].get("tensor", 1)): r for r in rows}
    assert by["train", 1]["attention"] == by["prefill", 1]["attention"] == "splash"
    assert [by[w, 1]["rows"] for w in ("train", "prefill", "decode")] == [8, 4, 16]  # (prefill: 16 rows / 4 samples)
    assert by["train", 1]["tokens"] == 8 * 200 and by["decode", 1]["tokens"] == 16
    for t in (1, 2):  # the dense cache as the engine places it: a quarter on each chip (its masks and index aside)
        assert by["decode", t]["cache_bytes_per_chip"] * 4 == pytest.approx(by["decode", t]["cache_bytes"], rel=1e-2)
    for r in rows:  # the time estimates follow from the model FLOPs and the chip's peak (v5e: 197 TFLOP/s)
        assert r["step_s_at_mfu"] == pytest.approx(r["model_flops"] / (4 * 197e12 * 0.4), rel=0.01)
        assert r["mfu_needed"] == pytest.approx(1e6 * r["model_flops"] / r["tokens"] / (4 * 197e12), rel=0.01)
    # a training token costs 3x a forward one (6N): the update's FLOPs per token over the decode step's
    per_token = by["train", 1]["model_flops"] / 1600 / (by["decode", 1]["model_flops"] / 16)
    assert 2.5 < per_token < 3.5


@needs_libtpu
def test_suggest_prints_the_fewest_micro_batches_that_fit_and_their_overrides():
    rows = aot("--preset=tiny", "--topologies=v5e:2x2", "--batch=16", "--length=128", "--meshes=fsdp=4", "--suggest")
    *compiled, suggestion = rows
    assert [r["rows"] for r in compiled] == [16] and compiled[0]["fits"]
    assert suggestion == {
        "suggest": "v5e:2x2",
        "micro_batches": 1,
        "rows": 16,
        "mesh": {"fsdp": 4},
        "overrides": "--config.train.micro_batches=1 --config.mesh.data=1 --config.mesh.fsdp=4 --config.mesh.tensor=1",
    }


@needs_libtpu
@pytest.mark.slow  # (55 s on an idle 2-core machine: the Pallas kernel's lowering)
def test_the_paged_decode_step_lowers_the_pallas_kernel_and_its_pool_follows_kv_tokens():
    """qwen3-0.6b (head_dim 128: the kernel's TPU tiling) on a v5e:2x2 over fsdp=2 x tensor=2: the
    paged step compiles with `paged_attention` for real chips, and a pool of a quarter of the
    tokens takes a quarter of the pool's memory."""
    flags = (
        "--preset=qwen3-0.6b",
        "--topologies=v5e:2x2",
        "--attention=splash",
        "--what=paged_decode",
        "--decode_batch=8",
        "--decode_length=1024",
        "--page_size=64",
        "--meshes=fsdp=2xtensor=2",
    )
    (full,) = aot(*flags)
    (quarter,) = aot(*flags, "--kv_tokens=2048")
    assert full["fits"] and full["attention"] == "paged" and "error" not in full, full
    assert (full["pages"], full["kv_tokens"], quarter["pages"], quarter["kv_tokens"]) == (130, 8192, 34, 2048)
    c = {"layers": 28, "kv_heads": 8, "head_dim": 128}  # (qwen3-0.6b)
    pool = 2 * c["layers"] * (c["kv_heads"] // 2) * (130 // 2) * 64 * c["head_dim"] * 2  # k and v, bf16, per chip
    assert full["pool_bytes_per_chip"] == pool
    saved = full["argument_bytes"] - quarter["argument_bytes"]
    assert saved == full["pool_bytes_per_chip"] - quarter["pool_bytes_per_chip"] > 0


def tiny_grpo_config(**grpo):
    from t2t_jax.config.defaults import base

    c = base()
    c.model.update(preset="tiny", dtype="bfloat16", remat="full", attention="auto", attn_chunk=0)
    c.grpo.update(prompts=2, group_size=4, **grpo)
    c.train.update(micro_batches=2, logprob_chunk=16, share_prompts=False)
    c.rollout.update(max_new_tokens=64, slots=8, chunk=4, page_size=16)
    return c


@needs_libtpu
def test_the_train_row_compiles_the_trainers_own_grpo_update(monkeypatch):
    """The train row lowers `Trainer._update_fn` itself (a spy sees its batch: old and reference
    log-probs when the config makes them, the whole batch of prompts x group_size rows), scanning
    train.micro_batches slices (the compiled loop's trip count)."""
    from t2t_jax import aot
    from t2t_jax.rl import trainer as trainer_lib

    seen = []
    original = trainer_lib.Trainer._update_fn

    def spy(self, state, batch):
        seen.append((self.loss, self.settings.micro_batches, {k: tuple(v.shape) for k, v in batch.items()}))
        return original(self, state, batch)

    monkeypatch.setattr(trainer_lib.Trainer, "_update_fn", spy)
    config = tiny_grpo_config(beta=0.04, num_iterations=2)
    sizes = aot.Sizes.from_config(config, prompt_tokens=32)
    topo, mesh = aot.topology_mesh("v5e:2x2", {"fsdp": 4})
    compiled, _, fields = aot.compile_train(config, sizes, mesh, aot.Report())
    ((loss, micro, shapes),) = seen
    assert (loss, micro) == ("grpo", 2)
    assert shapes["prompt_ids"] == (8, 32) and shapes["completion_ids"] == (8, 64) and shapes["advantages"] == (8,)
    assert shapes["old_logps"] == shapes["ref_logps"] == shapes["sampler_logps"] == (8, 64)
    assert fields["micro_batches"] == 2 and fields["micro_rows"] == 4 and fields["ref_model_bytes"] > 0
    trainer = trainer_lib.Trainer(
        aot.abstract_model(config.model, mesh), trainer_lib.TrainSettings.from_config(config), loss="grpo", mesh=mesh
    )
    lowered = trainer.lower(trainer.state_shapes(), trainer.batch_shapes(aot.batch_shapes(config, sizes))).as_text()
    assert "stablehlo.while" in lowered and "tensor<2x4x32xi32>" in lowered  # (the scan over 2 slices of 4 rows)
    row = aot.report_row(
        compiled, 1.0, topo, "v5e:2x2", {"fsdp": 4}, config.model, aot.Report(), what="train", **fields
    )
    assert row["fits"] and row["tokens"] == 8 * 96 and row["attention"] == "splash"


def test_the_abstract_train_state_and_batch_are_placed_as_init_and_shard_place_them():
    """`Trainer.state_shapes` / `batch_shapes` (what the AOT compile takes) carry the shapes,
    dtypes and shardings of `Trainer.init()` and `Trainer.shard(...)` (on this machine's devices)."""
    from t2t_jax import models, sharding
    from t2t_jax.rl.trainer import Trainer, TrainSettings

    config = tiny_grpo_config()
    mesh = sharding.make_mesh({"fsdp": -1})
    trainer = Trainer(models.build(config.model, 0, mesh), TrainSettings.from_config(config), loss="grpo", mesh=mesh)
    real, abstract = trainer.init(), trainer.state_shapes()
    batch = {"prompt_ids": np.zeros((8, 32), np.int32), "advantages": np.zeros((8,), np.float32)}

    def same(a, s):
        assert (a.shape, a.dtype) == (s.shape, s.dtype)
        assert a.sharding.is_equivalent_to(s.sharding, len(a.shape)), (a.sharding, s.sharding)

    assert jax.tree.structure(real) == jax.tree.structure(abstract)
    jax.tree.map(same, real, abstract)
    jax.tree.map(same, trainer.shard(batch), trainer.batch_shapes(batch))


@needs_libtpu
@pytest.mark.slow
def test_the_paper_config_fits_a_v5e_and_a_v5p_mesh():
    """configs/qwen3_4b.py: its GRPO update (256 sequences of 512 + 8,192 tokens in micro-batches
    of 32, splash) and the engine's paged decode chunk (rollout.slots = 64 rows, the Pallas kernel,
    a pool of every row's 8,704 tokens: the TPU default). The dense decode rows and the other
    meshes are in docs/results/aot/, from the commands in docs/model.md (a 4B compile takes
    minutes here, so CI compiles four)."""
    rows = aot(
        "--config=configs/qwen3_4b.py",
        "--topologies=v5e:4x4,v5p:4x4x4",
        "--meshes=fsdp=16,fsdp=32xtensor=2",
        "--what=train,paged_decode",
        timeout=2400,  # (four 4B compiles: 4-8 minutes each on a 2-core machine, docs/model.md)
    )
    implied, *rows = rows
    assert implied["from_config"]["batch"] == 32 and implied["from_config"]["length"] == 8704
    assert implied["from_config"]["decode_batch"] == 64
    fits = {(r["topology"], r["what"]): r["fits"] for r in rows}
    assert fits == {(t, w): True for t in ("v5e:4x4", "v5p:4x4x4") for w in ("train", "paged_decode")}, rows
    paged = [r for r in rows if r["what"] == "paged_decode"]
    assert all(r["attention"] == "paged" and r["kv_tokens"] == 64 * 8704 for r in paged), paged
