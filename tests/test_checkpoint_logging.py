"""Orbax checkpoints round-trip the train state and the JSON record; TensorBoard events read
back with TensorBoard's own reader."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from t2t_jax.checkpoint import Checkpointer
from t2t_jax.logging import SummaryWriter


def test_checkpoint_round_trip_and_keep(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=2)
    state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.int32(3), "nested": {"b": jnp.ones(4, jnp.bfloat16)}}
    for step in (1, 2, 3):
        ckpt.save(step, jax.tree.map(lambda x: x * step, state), {"stage": step, "history": [{"a": [1, 2]}]})
    assert ckpt.latest() == 3
    assert sorted(int(p) for p in os.listdir(tmp_path / "ckpt") if p.isdigit()) == [2, 3]
    restored, meta = ckpt.restore(3, state)
    assert meta == {"stage": 3, "history": [{"a": [1, 2]}]}
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b) * 3)
        assert a.dtype == b.dtype
    ckpt.save(3, state, {"stage": -1})  # an existing step is kept
    assert ckpt.restore(3, state)[1]["stage"] == 3
    # a half-written checkpoint (orbax's temporary directory) is never "latest"
    os.makedirs(tmp_path / "ckpt" / "4.orbax-checkpoint-tmp-0")
    assert Checkpointer(str(tmp_path / "ckpt")).latest() == 3


def test_tensorboard_events_read_back(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    writer.scalars(1, {"reward/valid": 0.25, "kl": 0.01})
    writer.scalars(2, {"reward/valid": 0.5})
    writer.text(2, "samples", "Agent 0: UP")
    writer.image(2, "failures", Image.new("RGB", (12, 8), "red"))
    writer.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/valid")] == [(1, 0.25), (2, 0.5)]
    assert "kl" in acc.Tags()["scalars"]
    text = acc.Tensors("samples")[0]
    assert text.tensor_proto.string_val[0].decode() == "Agent 0: UP"
    image = acc.Images("failures")[0]
    assert (image.width, image.height) == (12, 8)
