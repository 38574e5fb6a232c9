"""Verdicts + parse status -> one scalar reward per completion, from named weighted terms.

Terms (each [B] float32, logged by name so curves show which one moved):
  format      1 when the text parsed into a plan for exactly the board's agents (status OK)
  valid       1 for a valid plan
  optimal     1 for a valid plan at the certified optimal makespan
  progress    fraction of the board's agents on their goal at the end, 0 after any illegal move
  efficiency  optimal makespan / makespan for valid plans (1 at the optimum), else 0
  length      -(completion tokens / token budget), a penalty in [-1, 0]

The weights belong to the stage config (`RewardWeights` / a ConfigDict with these names), so
the engineer or a schedule can move them from accuracy towards efficiency between stages.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from t2t_jax.env.types import ParseStatus, Verdicts

TERMS = ("format", "valid", "optimal", "progress", "efficiency", "length")
# Stage 1 of the paper's schedule rewards accuracy; later stages add efficiency.
ACCURACY_FIRST = {"format": 0.1, "valid": 1.0, "optimal": 0.5, "progress": 0.2, "efficiency": 0.0, "length": 0.0}
# Once plans are mostly valid: reward reaching the optimum and short completions.
EFFICIENCY_NEXT = {"format": 0.1, "valid": 1.0, "optimal": 1.0, "progress": 0.0, "efficiency": 0.5, "length": 0.1}


def reward_terms(verdicts: Verdicts, parse_status, optimal_makespan, num_agents, lengths, max_length) -> dict:
    """All terms, [B] float32 each.

    Args:
      verdicts: Verdicts [B]; parse_status: [B] int; optimal_makespan: [B] int (UNKNOWN < 0);
      num_agents: [B] int; lengths: [B] completion tokens; max_length: the token budget.
    """
    valid = verdicts.valid
    on_goal = jnp.sum(verdicts.goal_reached, axis=-1) / jnp.maximum(num_agents, 1)
    known = optimal_makespan >= 0
    makespan = jnp.maximum(verdicts.makespan, 1)
    efficiency = jnp.where(verdicts.makespan == 0, 1.0, optimal_makespan / makespan)
    terms = {
        "format": parse_status == ParseStatus.OK,
        "valid": valid,
        "optimal": verdicts.optimal,
        "progress": jnp.where(verdicts.has_illegal_moves, 0.0, on_goal),
        "efficiency": jnp.where(valid & known, efficiency, 0.0),
        "length": -jnp.asarray(lengths) / max_length,
    }
    return {k: jnp.asarray(v, jnp.float32) for k, v in terms.items()}


def total_reward(terms: Mapping[str, jnp.ndarray], weights: Mapping[str, float]) -> jnp.ndarray:
    """Sum of weight * term; `weights` may omit terms (weight 0) but not name unknown ones."""
    unknown = set(weights) - set(TERMS)
    if unknown:
        raise ValueError(f"reward weights: unknown terms {sorted(unknown)}; known: {list(TERMS)}")
    return sum(weights.get(k, 0.0) * terms[k] for k in TERMS)
