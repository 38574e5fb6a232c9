"""Checkpoint integrity (t2t_jax/checkpoint.py): every step carries checksums; a truncated, altered
or incomplete newest checkpoint is moved aside with a warning naming it and the one before is
restored; none intact is one error."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.checkpoint import CHECKSUMS, Checkpointer, CheckpointError


def saved(tmp_path, steps=(1, 2, 3)):
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), keep=5)
    state = {"w": jnp.arange(4096.0).reshape(64, 64), "b": jnp.ones(8)}
    for step in steps:
        ckpt.save(step, jax.tree.map(lambda x: x * step, state), {"step": step})
    return ckpt, state


def largest_file(step_dir):
    files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs if f != CHECKSUMS]
    return max(files, key=os.path.getsize)


def test_intact_checkpoints_verify(tmp_path):
    ckpt, state = saved(tmp_path)
    assert all(os.path.exists(tmp_path / "checkpoints" / str(s) / CHECKSUMS) for s in (1, 2, 3))
    assert ckpt.latest_intact() == 3
    restored, meta = ckpt.restore(3, state)
    assert meta == {"step": 3}
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]) * 3)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_latest_falls_back_to_the_newest_intact_one(tmp_path, capsys, damage):
    ckpt, state = saved(tmp_path)
    victim = largest_file(tmp_path / "checkpoints" / "3")
    if damage == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    elif damage == "flip":
        with open(victim, "r+b") as f:
            data = bytearray(f.read())
            for i in range(0, min(len(data), 100 * 7), 7):  # 100 flipped bytes
                data[i] ^= 0xFF
            f.seek(0)
            f.write(data)
    else:
        os.remove(victim)
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_intact() == 2
    err = capsys.readouterr().err
    assert "warning: restoring checkpoint 2" in err and "3: " in err and os.path.basename(victim) in err
    assert (tmp_path / "corrupt_checkpoints" / "3").is_dir()  # moved aside, not deleted
    fresh = Checkpointer(str(tmp_path / "checkpoints"))
    assert fresh.latest() == 2
    restored, meta = fresh.restore(2, state)
    assert meta == {"step": 2}
    fresh.save(3, state, {"step": 30})  # the step number is free again
    assert fresh.restore(3, state)[1] == {"step": 30}


def test_none_intact_is_one_error(tmp_path):
    saved(tmp_path, steps=(1, 2))
    for step in (1, 2):
        with open(largest_file(tmp_path / "checkpoints" / str(step)), "r+b") as f:
            f.truncate(10)
    with pytest.raises(CheckpointError, match=r"no intact checkpoint under .*2: .*; 1: "):
        Checkpointer(str(tmp_path / "checkpoints")).latest_intact()


def test_no_checkpoints_is_none(tmp_path):
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_intact() is None
