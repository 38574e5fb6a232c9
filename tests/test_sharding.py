"""Sharding on 8 fake CPU devices, in a subprocess (the device count is fixed at JAX import)."""

import os
import subprocess
import sys

import pytest

from t2t_jax.sharding import make_mesh


@pytest.mark.slow  # (~100 s: 8 fake devices in a subprocess; CI runs the slow set)
def test_sharded_logits_and_samples_equal_single_device(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "sharded_check.py")
    out = subprocess.run([sys.executable, script, str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok ") == 7  # (5 meshes, the paged engine on 2 of them)


def test_mesh_errors():
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        make_mesh({"data": -1, "fsdp": -1})
    with pytest.raises(ValueError, match="need 4 devices"):
        make_mesh({"data": 4})
