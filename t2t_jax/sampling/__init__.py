"""Generation: `from t2t_jax.sampling import Sampler`."""
from t2t_jax.sampling.sampler import SampleOutput, Sampler, filter_logits, sample_step

__all__ = ["SampleOutput", "Sampler", "filter_logits", "sample_step"]
