"""Workloads shared by the benchmarks (launch.bench_model, launch.gpu_check): the GRPO rows'
Trainer settings and lognormal completion budgets."""

from __future__ import annotations

import statistics

import numpy as np


def grpo_settings(share_prompts: bool = False, group_size: int = 1):
    """The Trainer settings of the GRPO rows (dapo, no KL)."""
    from t2t_jax.rl.grpo import LossSettings
    from t2t_jax.rl.trainer import OptimSettings, TrainSettings

    optim = OptimSettings(
        learning_rate=1e-6,
        warmup_steps=1,
        decay_steps=100,
        end_lr_fraction=0.1,
        b1=0.9,
        b2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
    )
    return TrainSettings(
        optim=optim,
        loss=LossSettings("dapo", epsilon_low=0.2, epsilon_high=0.28, beta=0.0),
        logprob_chunk=256,
        group_size=group_size,
        share_prompts=share_prompts,
    )


def lognormal_budgets(median: float, sigma: float, cap: int, n: int, seed: int = 0) -> np.ndarray:
    """[n] budgets at the lognormal's n evenly spaced quantiles ((i + 1/2) / n), shuffled: the
    sample's median and tail are the distribution's whatever n (a random draw of 64 put p99 at
    9x the median), clipped to 1..cap."""
    z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    budgets = np.clip(np.round(median * np.exp(sigma * z)), 1, cap).astype(np.int32)
    return np.random.default_rng(seed).permutation(budgets)
