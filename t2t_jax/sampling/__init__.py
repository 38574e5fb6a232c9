"""Generation: `from t2t_jax.sampling import Sampler` (a static batch), `Engine` (continuous
batching, the same interface and outputs), `Constraint` for grammars."""

from t2t_jax.sampling.constrained import Constraint
from t2t_jax.sampling.engine import ENGINES, Engine, make_sampler
from t2t_jax.sampling.sampler import SampleOutput, Sampler, filter_logits, row_keys, sample_step

__all__ = [
    "ENGINES",
    "Constraint",
    "Engine",
    "make_sampler",
    "SampleOutput",
    "Sampler",
    "filter_logits",
    "row_keys",
    "sample_step",
]
