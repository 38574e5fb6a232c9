"""Hugging Face interop: `from_pretrained` / `save_pretrained` over safetensors.

Only safetensors are read (a single `model.safetensors` or shards listed in
`model.safetensors.index.json`); config.json must describe a dense Qwen3. Weights keep HF's
layouts (Linear [out, in]); the layers are stacked on a leading axis. With a mesh,
every weight is built shard by shard with `jax.make_array_from_callback`, each shard reading only
its slice of the file (memory-mapped), so no host or device ever holds the whole model.
"""

from __future__ import annotations

import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from t2t_jax.errors import UserError
from t2t_jax.models.qwen3.model import Qwen3, named_params
from t2t_jax.models.qwen3.presets import Qwen3Config

# Our stacked layer weight -> HF name inside model.layers.{i}.
HF_LAYER = {
    "input_norm": "input_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "post_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
}
HF_GLOBAL = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}


class CheckpointError(UserError, ValueError):
    """A checkpoint directory that cannot be loaded (the message names the file or tensor)."""


def _files(path: str) -> dict[str, str]:
    """tensor name -> safetensors file."""
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        root = os.path.realpath(path)
        files = {}
        for k, v in weight_map.items():
            target = os.path.realpath(os.path.join(root, v)) if isinstance(v, str) else ""
            if os.path.dirname(target) != root or not target.endswith(".safetensors"):
                raise CheckpointError(
                    f"{index}: weight_map[{k!r}] = {v!r} is not a .safetensors file of the checkpoint directory itself"
                )
            files[k] = target
        return files
    if os.path.exists(single):
        with safe_open(single, framework="numpy") as f:
            return {k: single for k in f.keys()}
    if any(n.endswith((".bin", ".pt", ".pth")) for n in os.listdir(path)):
        raise CheckpointError(
            f"{path}: only safetensors are read (found PyTorch pickles; convert them to safetensors first)"
        )
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


class _Reader:
    """Slices and shapes of named tensors, opening each file once (memory-mapped)."""

    def __init__(self, files):
        self.files, self.handles = files, {}

    def _tensor(self, name):
        if name not in self.files:
            raise CheckpointError(f"missing tensor {name!r}")
        path = self.files[name]
        if path not in self.handles:
            self.handles[path] = safe_open(path, framework="numpy")
        return self.handles[path].get_slice(name)

    def slice(self, name, index=None):
        tensor = self._tensor(name)
        return tensor[index] if index else tensor[:]

    def shape(self, name):
        return tuple(self._tensor(name).get_shape())


def hf_names(config: Qwen3Config, name: str) -> list[str]:
    """The Hugging Face tensor names of our weight `name` (one per layer for stacked weights)."""
    if name in HF_LAYER:
        return [f"model.layers.{i}.{HF_LAYER[name]}" for i in range(config.num_hidden_layers)]
    return [HF_GLOBAL[name]]


def _loader(reader, names, stacked, dtype):
    """index (tuple of slices over our shape) -> numpy block."""

    def load(index):
        index = tuple(index)
        if not stacked:
            return np.asarray(reader.slice(names[0], index)).astype(dtype)
        layer_idx, rest = index[0], index[1:]
        return np.stack([np.asarray(reader.slice(names[i], rest)) for i in range(len(names))[layer_idx]]).astype(dtype)

    return load


def from_pretrained(path: str, dtype=jnp.float32, mesh=None, rules=None, **model_kw) -> Qwen3:
    """A Qwen3 model from a local Hugging Face checkpoint directory.

    Args:
      path: directory with config.json and safetensors.
      dtype: parameter (and compute) dtype.
      mesh: a `jax.sharding.Mesh` to place weights on (see t2t_jax.sharding); None = one device.
      rules: logical-axis rules for the mesh (default `sharding.DEFAULT_RULES`).
      model_kw: extra Qwen3 arguments (remat, ...).
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{path}: no config.json")
    with open(cfg_path) as f:
        config = Qwen3Config.from_hf(json.load(f))
    reader = _Reader(_files(path))
    model = nnx.eval_shape(lambda: Qwen3(config, dtype=dtype, param_dtype=dtype, mesh=mesh, **model_kw))
    np_dtype = np.dtype(jnp.dtype(dtype))
    for name, param in named_params(model).items():
        names = hf_names(config, name)
        stacked = name in HF_LAYER
        expect = param.value.shape[1:] if stacked else param.value.shape
        for n in names:
            shape = reader.shape(n)
            if shape != tuple(expect):
                raise CheckpointError(f"tensor {n!r} has shape {list(shape)}, expected {list(expect)}")
        load = _loader(reader, names, stacked, np_dtype)
        shape = param.value.shape
        if mesh is None:
            param.value = jnp.asarray(load(tuple(slice(None) for _ in shape)))
        else:
            from t2t_jax.sharding import param_sharding

            sharding = param_sharding(Qwen3.logical_axes(name), shape, mesh, rules)
            param.value = jax.make_array_from_callback(shape, sharding, load)
    return model


def save_pretrained(model: Qwen3, path: str) -> None:
    """Write config.json + model.safetensors that `transformers` loads as Qwen3ForCausalLM.

    Files are written under temporary names and renamed, so nothing half-written is left."""
    os.makedirs(path, exist_ok=True)
    config = model.config
    tensors = {}
    for name, param in named_params(model).items():
        value = np.asarray(jax.device_get(param.value))
        blocks = value if name in HF_LAYER else value[None]
        for n, block in zip(hf_names(config, name), blocks):
            tensors[n] = np.ascontiguousarray(block)
    hf = config.to_hf()
    hf["torch_dtype"] = str(np.dtype(jnp.dtype(model.embed.value.dtype)))
    tmp_st = tempfile.mktemp(dir=path, suffix=".tmp")
    tmp_cfg = tempfile.mktemp(dir=path, suffix=".tmp")
    try:
        save_file(tensors, tmp_st, metadata={"format": "pt"})
        with open(tmp_cfg, "w") as f:
            json.dump(hf, f, indent=2)
        os.replace(tmp_st, os.path.join(path, "model.safetensors"))
        os.replace(tmp_cfg, os.path.join(path, "config.json"))
    finally:
        for tmp in (tmp_st, tmp_cfg):
            if os.path.exists(tmp):
                os.unlink(tmp)
