"""Curricula that do not decode, behind the same interface as the engineer: `fixed`, `random`,
`frontier`, `learnability`. Each maps (account, current config, first config, rng) to the next
EnvConfig and a reason; reward weights follow `reward_schedule`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t2t_jax.engineer.propose import DENSITIES
from t2t_jax.env.config import Bucket, ConfigError, EnvConfig
from t2t_jax.rl.rewards import ACCURACY_FIRST, EFFICIENCY_NEXT


def reward_schedule(valid_rate: float, threshold: float) -> dict:
    """Accuracy-first weights until the valid rate reaches `threshold`, then efficiency too."""
    return dict(EFFICIENCY_NEXT if valid_rate >= threshold else ACCURACY_FIRST)


def _config(buckets, like: EnvConfig) -> EnvConfig:
    return EnvConfig(buckets=tuple(buckets), max_size=like.max_size, max_agents=like.max_agents)


def fixed(account, config, first, rng, agent_range):
    return first, "fixed: the first config every stage"


def random_mixture(account, config, first, rng, agent_range, tries: int = 200):
    """1-3 buckets with uniformly drawn ranges (the paper's "GRPO (random)")."""
    for _ in range(tries):
        buckets = []
        for _ in range(int(rng.integers(1, 4))):
            size = sorted(rng.integers(3, config.max_size + 1, 2).tolist())
            agents = sorted(rng.integers(agent_range[0], agent_range[1] + 1, 2).tolist())
            density = sorted(rng.choice(DENSITIES, 2).tolist())
            buckets.append(
                Bucket(
                    size=tuple(size),
                    agents=tuple(agents),
                    hole_density=tuple(density),
                    min_distance=1,
                    weight=float(rng.choice([0.5, 1.0, 2.0])),
                )
            )
        try:
            return _config(buckets, config), "random: a random mixture"
        except ConfigError:
            continue
    return config, f"random: no satisfiable mixture in {tries} draws; config kept"


def _shift(bucket: Bucket, direction: int, config: EnvConfig, agent_range) -> Bucket:
    """One step harder (+1) or easier (-1): map size, then hole density, then agents."""
    lo, hi = bucket.size
    if 3 <= lo + direction and hi + direction <= config.max_size:
        return dataclasses.replace(bucket, size=(lo + direction, hi + direction))
    d = tuple(float(np.clip(round(x + 0.1 * direction, 2), 0.0, 0.5)) for x in bucket.hole_density)
    if d != bucket.hole_density:
        return dataclasses.replace(bucket, hole_density=d)
    a = tuple(int(np.clip(x + direction, *agent_range)) for x in bucket.agents)
    return dataclasses.replace(bucket, agents=a)


def frontier(account, config, first, rng, agent_range, high: float = 0.8, low: float = 0.2):
    """Per bucket: one step harder above `high` valid, one step easier below `low`."""
    out, notes = [], []
    for b, stats in zip(config.buckets, account["buckets"]):
        step = 1 if stats["valid"] > high else (-1 if stats["valid"] < low else 0)
        new = _shift(b, step, config, agent_range) if step else b
        try:
            _config([new], config)
        except ConfigError:
            new, step = b, 0
        out.append(new)
        notes.append(f"bucket {stats['bucket']}: {'harder' if step > 0 else 'easier' if step < 0 else 'kept'}")
    return _config(out, config), "frontier: " + "; ".join(notes)


def learnability(account, config, first, rng, agent_range, floor: float = 0.05):
    """Bucket weights proportional to p (1 - p) of the valid rate (+ a floor so none is 0)."""
    p = np.array([s["valid"] for s in account["buckets"]])
    w = p * (1 - p) + floor
    w = w / w.sum()
    buckets = [dataclasses.replace(b, weight=round(float(x), 4)) for b, x in zip(config.buckets, w)]
    return _config(buckets, config), f"learnability: weights {np.round(w, 3).tolist()}"


BASELINES = {"fixed": fixed, "random": random_mixture, "frontier": frontier, "learnability": learnability}
