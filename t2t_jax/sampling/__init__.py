"""Generation: `from t2t_jax.sampling import Sampler` (and `Constraint` for grammars)."""

from t2t_jax.sampling.constrained import Constraint
from t2t_jax.sampling.sampler import SampleOutput, Sampler, filter_logits, sample_step

__all__ = ["Constraint", "SampleOutput", "Sampler", "filter_logits", "sample_step"]
