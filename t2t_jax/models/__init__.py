"""Models behind one interface (`base.CausalLM`), found by name.

    model = models.build(config.model, seed=0, mesh=mesh)   # a preset, or a local HF checkpoint
    model = models.from_pretrained("/ckpt/Qwen3-4B")         # the family from its config.json

A family is a package with `PRESETS` (name -> config), `from_pretrained(path, dtype, mesh,
**kw)` and a model class `MODEL(config, dtype=, param_dtype=, mesh=, rngs=, **kw)` (kw: remat,
attention, attn_chunk, scan_layers); it registers in `FAMILIES` under its Hugging Face
`model_type`.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
from flax import nnx

from t2t_jax.models import qwen3
from t2t_jax.models.base import Cache, CausalLM

FAMILIES = {"qwen3": qwen3}


def family_of_preset(preset: str):
    """The family whose PRESETS holds `preset`."""
    for family in FAMILIES.values():
        if preset in family.PRESETS:
            return family
    known = sorted(p for f in FAMILIES.values() for p in f.PRESETS)
    raise ValueError(f"model.preset: {preset!r} is not one of {known}")


def family_of_checkpoint(path: str):
    """The family of a local HF checkpoint, by its config.json's model_type."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError):
        return qwen3  # (from_pretrained then names what is missing or malformed)
    if model_type not in FAMILIES:
        raise ValueError(f"{path}: model_type {model_type!r} is not one of {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def from_pretrained(path: str, dtype=jnp.float32, mesh=None, **kw) -> CausalLM:
    """A model from a local Hugging Face checkpoint, of the family its config.json names."""
    return family_of_checkpoint(path).from_pretrained(path, dtype=dtype, mesh=mesh, **kw)


def build(model_config, seed: int, mesh=None) -> CausalLM:
    """The policy of a stage-loop config's `model` section: `checkpoint` (a local HF directory)
    when set, else `preset` with fresh weights from `seed`; placed on `mesh` when given."""
    from t2t_jax import sharding

    dtype = jnp.dtype(model_config.dtype)
    kw = dict(
        remat=model_config.remat,
        attention=model_config.attention,
        attn_chunk=model_config.attn_chunk,
        scan_layers=model_config.scan_layers,
    )
    if model_config.checkpoint:
        return from_pretrained(model_config.checkpoint, dtype=dtype, mesh=mesh, **kw)
    family = family_of_preset(model_config.preset)
    config = family.PRESETS[model_config.preset]
    model = family.MODEL(config, dtype=dtype, param_dtype=dtype, mesh=mesh, rngs=nnx.Rngs(seed), **kw)
    return sharding.shard_model(model, mesh) if mesh is not None else model


__all__ = ["FAMILIES", "Cache", "CausalLM", "build", "family_of_checkpoint", "family_of_preset", "from_pretrained"]
