"""The model seam: the interface the sampler, trainer and sharding rely on (models/base.py),
models.build by preset or checkpoint, sharding that knows no model, and old runs' configs."""

import ast
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

import configs.stage
from t2t_jax import models, rundir, runrecord, sharding
from t2t_jax.config import upgrade
from t2t_jax.models import qwen3
from t2t_jax.models.base import Cache, CausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_qwen3_and_its_cache_implement_the_interface():
    model = models.build(configs.stage.get_config().model, seed=0)
    assert isinstance(model, qwen3.Qwen3) and isinstance(model, CausalLM)
    cache = model.init_cache(2, 8)
    assert isinstance(cache, Cache)
    wide = cache.map_rows(lambda x: jnp.repeat(x, 3, axis=0))
    assert wide.valid.shape == (6, 8) and wide.k[0].shape[0] == 6 and wide.index.shape == ()
    names = model.named_params()
    assert set(names) >= {"embed", "final_norm", "q_proj"} and model.logical_axes("q_proj") == (
        "layers",
        "q_heads",
        "embed",
    )


def test_build_by_preset_and_checkpoint_and_clear_errors(tmp_path):
    c = configs.stage.get_config().model
    a, b = models.build(c, seed=3), models.build(c, seed=3)
    np.testing.assert_array_equal(np.asarray(a.embed.value), np.asarray(b.embed.value))
    qwen3.save_pretrained(a, str(tmp_path / "ckpt"))
    c.checkpoint = str(tmp_path / "ckpt")
    loaded = models.build(c, seed=0)  # the checkpoint's weights, not the seed's
    np.testing.assert_array_equal(np.asarray(loaded.embed.value), np.asarray(a.embed.value))
    c.checkpoint, c.preset = "", "gpt-9"
    with pytest.raises(ValueError, match="model.preset: 'gpt-9' is not one of"):
        models.build(c, seed=0)
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama' is not one of \\['qwen3'\\]"):
        models.from_pretrained(str(other))


class Toy(nnx.Module):
    """Not a Qwen3: two weights with their own logical axes."""

    def __init__(self):
        self.w = nnx.Param(jnp.arange(8.0).reshape(4, 2))
        self.b = nnx.Param(jnp.zeros(4))

    def named_params(self):
        return {"w": self.w, "b": self.b}

    @staticmethod
    def logical_axes(name):
        return {"w": ("mlp", "embed"), "b": ("mlp",)}[name]


def test_sharding_places_any_model_by_its_own_axes():
    mesh = sharding.make_mesh({"fsdp": 1, "tensor": -1}, jax.devices()[:1])
    toy = sharding.shard_model(Toy(), mesh)
    assert toy.w.value.sharding.spec == PartitionSpec("tensor", "fsdp")
    assert toy.b.value.sharding.spec == PartitionSpec("tensor")
    np.testing.assert_array_equal(np.asarray(toy.w.value), np.arange(8.0).reshape(4, 2))
    source = ast.parse(open(os.path.join(ROOT, "t2t_jax", "sharding.py")).read())
    imported = [n.module for n in ast.walk(source) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m and m.startswith("t2t_jax.models")], imported


def test_an_old_runs_config_reads_as_today_and_resumes_without_changes(tmp_path):
    today = configs.stage.get_config().to_dict()
    old = json.loads(json.dumps(today))
    del old["model"]["scan_layers"], old["grpo"]["control"], old["train"]["share_prompts"]
    filled = upgrade.upgrade_config(old)
    assert filled["model"]["scan_layers"] is True and filled["grpo"]["control"] == today["grpo"]["control"]
    assert filled["train"]["share_prompts"] is False  # what runs made before the field did
    assert "scan_layers" not in old["model"]  # a copy
    assert rundir.changes(filled, today) == {"train.share_prompts": [False, True]}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert rundir.current_config(str(tmp_path))["model"]["scan_layers"] is True
    c = configs.stage.get_config()
    assert runrecord.upgrade_meta({"phase": "grpo"}, c)["has_ref"] is bool(c.grpo.beta)
    assert runrecord.upgrade_meta({"phase": "sft", "has_ref": True}, c)["has_ref"] is True


def test_the_run_record_round_trips_and_reads_old_checkpoints():
    from t2t_jax.runrecord import RunRecord

    c = configs.stage.get_config()
    record = RunRecord.start({"buckets": []}, {"valid": 1.0}, sft=True)
    assert (record.phase, record.stage, record.step, record.counter) == ("sft", 0, 0, 0)
    assert RunRecord.from_json(record.to_json(), c) == record
    old = {k: v for k, v in record.to_json().items() if k not in ("trajectory", "has_ref")}
    old.update(phase="grpo")
    back = RunRecord.from_json(json.loads(json.dumps(old)), c)
    assert back.trajectory == [] and back.has_ref is bool(c.grpo.beta) and back.phase == "grpo"
