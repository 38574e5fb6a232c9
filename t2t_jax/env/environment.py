"""`MAPFFrozenLake`: a `jumanji.Environment` over the same core as the validator.

One board per environment state (use jumanji's `VmapWrapper` / `AutoResetWrapper` for batches).
An action is `[A]` int32 codes, one per agent slot (padded slots are ignored). The episode
terminates with reward +1 when every agent stands on its goal, with reward -1 at the first
illegal move (leaving the grid, entering a hole, a vertex or edge collision), and is truncated
after `time_limit` steps.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jumanji import specs
from jumanji.env import Environment
from jumanji.types import TimeStep, restart, termination, transition, truncation

from t2t_jax.env import distances
from t2t_jax.env.config import EnvConfig
from t2t_jax.env.generator import Generator
from t2t_jax.env.types import ACTION_NAMES, Boards
from t2t_jax.env.validator import collisions, move


@chex.dataclass(frozen=True)
class State:
    """board: one Boards entry (no batch dim); positions: [A, 2] int32; fallen: [A] bool;
    step_count: [] int32; key: PRNG key."""

    board: Boards
    positions: chex.Array
    fallen: chex.Array
    step_count: chex.Array
    key: chex.PRNGKey


class Observation(NamedTuple):
    """grid: [S, S] int8 (0 frozen, 1 hole, 2 outside the board); positions, goals: [A, 2]
    int32; agent_mask: [A] bool; step_count: [] int32."""

    grid: chex.Array
    positions: chex.Array
    goals: chex.Array
    agent_mask: chex.Array
    step_count: chex.Array


class MAPFFrozenLake(Environment[State, specs.MultiDiscreteArray, Observation]):
    """Multi-agent path finding on a frozen lake, stepped one joint move at a time."""

    def __init__(self, config: EnvConfig, time_limit: int = 64, generator: Generator | None = None):
        self.config = config
        self.time_limit = time_limit
        self.generator = generator or Generator(config)
        super().__init__()

    def _observe(self, state: State) -> Observation:
        b = state.board
        outside = ~(jnp.arange(self.config.max_size)[:, None] < b.size) | ~(
            jnp.arange(self.config.max_size)[None, :] < b.size
        )
        grid = jnp.where(outside, 2, b.holes.astype(jnp.int8)).astype(jnp.int8)
        return Observation(
            grid=grid, positions=state.positions, goals=b.goals, agent_mask=b.agent_mask, step_count=state.step_count
        )

    def reset(self, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        key, sub = jax.random.split(key)
        board = self.generator.one(sub)
        state = State(
            board=board,
            positions=board.starts,
            fallen=jnp.zeros_like(board.agent_mask),
            step_count=jnp.int32(0),
            key=key,
        )
        return state, restart(self._observe(state))

    def step(self, state: State, action: chex.Array) -> tuple[State, TimeStep[Observation]]:
        b = state.board
        action = jnp.where(b.agent_mask, action, 0)
        r, c = state.positions[:, 0], state.positions[:, 1]
        nr, nc, outside, entered = move(r, c, action, b.size, distances.pack(b.holes), state.fallen)
        vertex, edge = collisions(r, c, nr, nc, b.agent_mask)
        new = jnp.stack([nr, nc], -1)
        illegal = jnp.any((outside | entered) & b.agent_mask) | vertex | edge
        solved = jnp.all(jnp.all(new == b.goals, axis=-1) | ~b.agent_mask)
        state = State(
            board=b, positions=new, fallen=state.fallen | entered, step_count=state.step_count + 1, key=state.key
        )
        obs = self._observe(state)
        reward = jnp.where(illegal, -1.0, jnp.where(solved, 1.0, 0.0))
        done = illegal | solved
        timestep = jax.lax.cond(
            done,
            lambda: termination(reward, obs),
            lambda: jax.lax.cond(
                state.step_count >= self.time_limit, lambda: truncation(reward, obs), lambda: transition(reward, obs)
            ),
        )
        return state, timestep

    @cached_property
    def observation_spec(self) -> specs.Spec[Observation]:
        s, a = self.config.max_size, self.config.max_agents
        return specs.Spec(
            Observation,
            "ObservationSpec",
            grid=specs.BoundedArray((s, s), jnp.int8, 0, 2, "grid"),
            positions=specs.BoundedArray((a, 2), jnp.int32, 0, s - 1, "positions"),
            goals=specs.BoundedArray((a, 2), jnp.int32, 0, s - 1, "goals"),
            agent_mask=specs.BoundedArray((a,), bool, False, True, "agent_mask"),
            step_count=specs.BoundedArray((), jnp.int32, 0, self.time_limit, "step_count"),
        )

    @cached_property
    def action_spec(self) -> specs.MultiDiscreteArray:
        return specs.MultiDiscreteArray(
            num_values=jnp.full((self.config.max_agents,), len(ACTION_NAMES), jnp.int32), name="action"
        )
