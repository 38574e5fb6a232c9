"""Qwen3 in Flax NNX: `from t2t_jax.models import qwen3`.

model = qwen3.from_pretrained(path, dtype=jnp.float32)        # local HF checkpoint
logits = model(input_ids, attention_mask=mask)                 # [batch, length, vocab]
qwen3.save_pretrained(model, path)                             # loadable by transformers
model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))   # fresh weights
"""

from t2t_jax.models.qwen3.model import KVCache, Qwen3, num_params
from t2t_jax.models.qwen3.params import CheckpointError, from_pretrained, save_pretrained
from t2t_jax.models.qwen3.presets import PRESETS, Qwen3Config

MODEL = Qwen3  # the family's model class (t2t_jax.models.build)

__all__ = [
    "MODEL",
    "CheckpointError",
    "KVCache",
    "PRESETS",
    "Qwen3",
    "Qwen3Config",
    "from_pretrained",
    "num_params",
    "save_pretrained",
]
