"""Meshes and logical-axis sharding rules (in the style of MaxText's logical axis rules).

A mesh comes from a dict of axis sizes, -1 meaning "the rest of the devices":
`make_mesh({"data": 1, "fsdp": -1, "tensor": 2})`. Parameters and activations carry logical
axes (`embed`, `q_heads`, `kv_heads`, `mlp`, `vocab`, `layers`, `head_dim`, `batch`), which each
model declares (`model.logical_axes(name)`, t2t_jax/models/base.py); `rules` map each logical
axis to mesh axes (or None: replicated). A rule whose mesh axes do not divide the dimension
falls back to replication for that dimension. Nothing here knows a particular model.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DEFAULT_RULES = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "layers": None,
}


def make_mesh(axes: dict[str, int], devices=None) -> Mesh:
    """A Mesh with the named axis sizes; one size may be -1 (the remaining devices)."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = dict(axes)
    free = [k for k, v in sizes.items() if v == -1]
    if len(free) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {free}")
    known = math.prod(v for v in sizes.values() if v != -1)
    if free:
        if len(devices) % known:
            raise ValueError(f"mesh: {len(devices)} devices do not divide by {known}")
        sizes[free[0]] = len(devices) // known
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"mesh: axes {sizes} need {math.prod(sizes.values())} devices, {len(devices)} available")
    return Mesh(np.array(devices).reshape(tuple(sizes.values())), tuple(sizes))


def spec(axes: tuple, shape: tuple, mesh: Mesh, rules=None) -> PartitionSpec:
    """PartitionSpec for logical `axes` of an array of `shape` (non-dividing rules replicate)."""
    rules = DEFAULT_RULES if rules is None else rules
    out, used = [], set()
    for axis, dim in zip(axes, shape):
        mesh_axes = rules.get(axis)
        mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
        mesh_axes = tuple(a for a in mesh_axes if a in mesh.shape and a not in used)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or dim % size:
            out.append(None)
            continue
        used.update(mesh_axes)
        out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*out)


def param_sharding(axes: tuple, shape: tuple, mesh: Mesh, rules=None) -> NamedSharding:
    """The NamedSharding of a weight with logical `axes` and `shape`."""
    return NamedSharding(mesh, spec(axes, shape, mesh, rules))


def shard_model(model, mesh: Mesh, rules=None):
    """Place every weight of a model (`named_params()`, `logical_axes(name)`) on the mesh, in
    place; returns the model. Each process must hold the same values (same seed or checkpoint);
    it places only its own shards, so this works multi-host."""
    for name, param in model.named_params().items():
        host = np.asarray(param.value)
        sharding = param_sharding(model.logical_axes(name), host.shape, mesh, rules)
        param.value = jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx])
    return model


def batch_sharding(mesh: Mesh, ndim: int = 2, rules=None) -> NamedSharding:
    """Inputs [batch, ...]: the batch over the data axes, the rest replicated."""
    rules = DEFAULT_RULES if rules is None else rules
    axes = rules.get("batch")
    axes = tuple(a for a in ((axes,) if isinstance(axes, str) else axes or ()) if a in mesh.shape)
    return NamedSharding(mesh, PartitionSpec(axes if axes else None, *([None] * (ndim - 1))))
