"""Batched, padded MAPF-FrozenLake pytrees: `Boards`, `Plans`, `Verdicts`.

Every array has a leading batch dimension `B`. Boards of different sizes and agent counts share
one padded shape: `S = holes.shape[-1]` is the static maximum map size and `A = starts.shape[-2]`
the static maximum agent count. Cells outside a board's `size` and agent slots outside its
`agent_mask` are padding and are ignored everywhere.
"""

from __future__ import annotations

import enum

import chex
import jax.numpy as jnp

# Actions (the MAPF contract): STAY = 0 so that zero padding is a no-op.
STAY, UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3, 4
ACTION_NAMES = ("STAY", "UP", "DOWN", "LEFT", "RIGHT")
# (d_row, d_col) per action, row 0 at the top.
ACTION_DELTAS = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))

UNKNOWN = -1  # an optimal makespan / lower bound / step that is not known or does not exist


class ParseStatus(enum.IntEnum):
    """How a completion's text became a plan (set by the parser; `OK` for hand-made plans)."""

    OK = 0
    NO_ANSWER = 1  # no plan line found
    MISSING_AGENT = 2  # some agent of the board has no line
    UNKNOWN_AGENT = 3  # a line names an agent the board does not have
    BAD_ACTION = 4  # a word that is not an action
    TOO_LONG = 5  # more actions than the plan horizon holds
    TRUNCATED = 6  # the completion hit its token budget


# Statuses that make the text unusable as a plan (the verdict's `parse_error`).
PARSE_ERRORS = (ParseStatus.NO_ANSWER, ParseStatus.UNKNOWN_AGENT, ParseStatus.BAD_ACTION, ParseStatus.TOO_LONG)


@chex.dataclass(frozen=True)
class Boards:
    """A padded batch of boards.

    Attributes:
      size: [B] int32, the board side N (3 <= N <= S).
      holes: [B, S, S] bool, True for a hole; always False outside the N x N grid.
      starts: [B, A, 2] int32 (row, col) per agent slot; zero in padded slots.
      goals: [B, A, 2] int32 (row, col) per agent slot; zero in padded slots.
      agent_mask: [B, A] bool, True for the board's K agents (the first K slots).
      bucket: [B] int32, index of the `EnvConfig` bucket the board was drawn from.
      lower_bound: [B] int32, the largest single-agent shortest distance (UNKNOWN if not set).
      optimal_makespan: [B] int32, the certified optimum (UNKNOWN until certified).
    """

    size: chex.Array
    holes: chex.Array
    starts: chex.Array
    goals: chex.Array
    agent_mask: chex.Array
    bucket: chex.Array
    lower_bound: chex.Array
    optimal_makespan: chex.Array

    @property
    def max_size(self) -> int:
        return self.holes.shape[-1]

    @property
    def max_agents(self) -> int:
        return self.starts.shape[-2]

    @property
    def num_agents(self) -> chex.Array:
        """[B] int32, agents per board."""
        return self.agent_mask.sum(-1).astype(jnp.int32)

    def free(self) -> chex.Array:
        """[B, S, S] bool, frozen (walkable) cells inside each board's grid."""
        return inside(self.size, self.max_size) & ~self.holes


def inside(size: chex.Array, max_size: int) -> chex.Array:
    """[B] board sizes -> [B, S, S] bool mask of the cells inside each N x N grid."""
    idx = jnp.arange(max_size)
    in_range = idx[None, :] < size[:, None]
    return in_range[:, :, None] & in_range[:, None, :]


@chex.dataclass(frozen=True)
class Plans:
    """A padded batch of joint plans.

    Attributes:
      actions: [B, A, T] int8 action codes; an agent stays (STAY = 0) after its last action.
        `T` is the static plan horizon.
      lengths: [B, A] int32, the number of actions written for each agent.
      present: [B, A] bool, True where the plan has a line for that agent slot.
      parse_status: [B] int32 `ParseStatus`; `OK` for plans that did not come from text.
      unknown_agent: [B] bool, the plan named an agent the board does not have (including
        indices beyond the padded agent slots, which `present` cannot hold).
    """

    actions: chex.Array
    lengths: chex.Array
    present: chex.Array
    parse_status: chex.Array
    unknown_agent: chex.Array

    @property
    def horizon(self) -> int:
        return self.actions.shape[-1]


@chex.dataclass(frozen=True)
class Verdicts:
    """What the validator found, per board (all [B] unless noted).

    Attributes:
      valid: bool, the contract's validity (no violation, every agent has a line, all goals).
      optimal: bool, valid and makespan == the board's certified optimal makespan.
      makespan: int32, the first time after which every agent stays on its goal
        (UNKNOWN when the agents do not all end on their goals).
      all_goals_reached: bool, every agent ends on its goal.
      has_illegal_moves: bool, any of out_of_bounds, hole, vertex_collision, edge_collision.
      out_of_bounds: bool, an agent tried to leave the grid (it stays where it was).
      hole: bool, an agent entered a hole (it stays in the hole from then on).
      vertex_collision: bool, two agents shared a cell at the same time.
      edge_collision: bool, two agents swapped cells in one step.
      missing_agent: bool, an agent of the board has no line in the plan.
      unknown_agent: bool, the plan has a line for an agent the board does not have.
      parse_error: bool, the text could not be read as a plan (see `PARSE_ERRORS`).
      truncated: bool, the completion hit its token budget.
      goal_reached: [B, A] bool, each agent ends on its goal (False in padded slots).
      first_violation_step: int32, time t >= 1 of the first illegal move (the move from t-1 to
        t), UNKNOWN if none.
      sum_of_costs: int32, per-agent arrival times (last time off its goal, +1) summed over the
        board's agents; UNKNOWN unless all_goals_reached.
    """

    valid: chex.Array
    optimal: chex.Array
    makespan: chex.Array
    all_goals_reached: chex.Array
    has_illegal_moves: chex.Array
    out_of_bounds: chex.Array
    hole: chex.Array
    vertex_collision: chex.Array
    edge_collision: chex.Array
    missing_agent: chex.Array
    unknown_agent: chex.Array
    parse_error: chex.Array
    truncated: chex.Array
    goal_reached: chex.Array
    first_violation_step: chex.Array
    sum_of_costs: chex.Array
