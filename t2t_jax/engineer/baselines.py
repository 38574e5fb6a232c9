"""Curricula that do not decode, behind the same interface as the engineer: `fixed`, `random`,
`frontier`, `learnability`, `uniform` (a proposal drawn uniformly from the proposal schema) and
the scripted evidence engineer `scripted` / `scripted_rewrite` (reads the account's statistics
and failure breakdown; selective edits or a rewrite). Each maps (account, current config, first
config, rng) to the next EnvConfig and a reason; reward weights follow `reward_schedule`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from t2t_jax.engineer import propose
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


def uniform(account, config, first, rng, agent_range, max_edits: int = 4, tries: int = 200):
    """A proposal drawn uniformly from the proposal schema (propose.proposal_schema: 1 to
    `max_edits` edits, each value uniform over its enumeration), applied as a selective edit; the
    first draw that passes propose.apply_proposal's checks."""
    props = propose.proposal_schema(config, agent_range, max_edits)["properties"]["edits"]["items"]["properties"]
    for _ in range(tries):
        edits = [
            {k: spec["enum"][int(rng.integers(len(spec["enum"])))] for k, spec in props.items()}
            for _ in range(int(rng.integers(1, max_edits + 1)))
        ]
        try:
            proposal = {"edits": edits}
            new, _ = propose.apply_proposal(proposal, config, {"valid": 1.0}, "selective", agent_range, max_edits)
        except propose.ProposalError:
            continue
        return new, f"uniform: {len(edits)} edits drawn from the proposal schema"
    return config, f"uniform: no legal proposal in {tries} draws; config kept"


def _easier_from_cells(bucket: Bucket, cells: list[dict], config: EnvConfig, agent_range) -> Bucket:
    """A failing bucket narrowed away from its failing cells of the breakdown: below the smallest
    failing map size, else below the failing hole band, else one agent fewer, else one step easier."""
    sizes = [c["size"] for c in cells]
    lo, hi = bucket.size
    if sizes and lo <= min(sizes) - 1 < hi:
        return dataclasses.replace(bucket, size=(lo, min(sizes) - 1))
    bands = [c["holes"][0] for c in cells]
    d_lo, d_hi = bucket.hole_density
    if bands and d_lo <= round(min(bands) - 0.1, 2) < d_hi:
        return dataclasses.replace(bucket, hole_density=(d_lo, round(min(bands) - 0.1, 2)))
    a_lo, a_hi = bucket.agents
    if a_hi > max(a_lo, agent_range[0]):
        return dataclasses.replace(bucket, agents=(a_lo, a_hi - 1))
    return _shift(bucket, -1, config, agent_range)


def scripted(account, config, first, rng, agent_range, rewrite: bool = False, high=0.8, low=0.2):
    """The scripted evidence engineer: a bucket above `high` valid goes one step harder; one below
    `low` goes easier, narrowed away from its failing cells where the account has the breakdown
    (engineer.breakdown_cells > 0), else one step (as `frontier`); buckets between are on the
    frontier and weigh 3, the edited ones 1. Selective: only the edited buckets change; rewrite
    (`scripted_rewrite`): the config is rebuilt from the buckets with signal, those at 0 valid
    that no edit made easier dropped (at least one kept)."""
    cells = account.get("breakdown") or []
    out, notes = [], []
    for b, stats in zip(config.buckets, account["buckets"]):
        p, mine = stats["valid"], [c for c in cells if c["bucket"] == stats["bucket"] and c["valid"] < low]
        if p > high:
            new, note = _shift(b, 1, config, agent_range), "harder"
        elif p < low:
            new = _easier_from_cells(b, mine, config, agent_range) if mine else _shift(b, -1, config, agent_range)
            note = f"easier ({len(mine)} failing cells)" if mine else "easier"
        else:
            new, note = b, "kept"
        try:
            _config([new], config)
        except ConfigError:
            new, note = b, "kept (no legal edit)"
        if rewrite and p == 0.0 and new == b:
            notes.append(f"bucket {stats['bucket']}: dropped (no signal)")
            continue
        on_frontier = new == b and low <= p <= high
        weight = 3.0 if on_frontier else 1.0 if (new != b or rewrite) else b.weight
        out.append(dataclasses.replace(new, weight=weight))
        notes.append(f"bucket {stats['bucket']}: {note}")
    out = out or [min(config.buckets, key=lambda b: b.size)]
    mode = "rewrite" if rewrite else "selective"
    return _config(out, config), f"scripted ({mode}, breakdown {'on' if cells else 'off'}): " + "; ".join(notes)


def scripted_rewrite(account, config, first, rng, agent_range):
    """`scripted` as a rewrite."""
    return scripted(account, config, first, rng, agent_range, rewrite=True)


BASELINES = {
    "fixed": fixed,
    "random": random_mixture,
    "frontier": frontier,
    "learnability": learnability,
    "uniform": uniform,
    "scripted": scripted,
    "scripted_rewrite": scripted_rewrite,
}
