"""Models: `from t2t_jax.models import qwen3`."""
