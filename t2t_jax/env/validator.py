"""`validate(boards, plans) -> Verdicts`: the MAPF contract, jitted, `lax.scan` over time and
`vmap` over boards.

Arrays are laid out batch-minor inside (agents x boards), so every step is a few SIMD-friendly
elementwise passes over the batch; `move` and `collisions` take `[A, ...]` arrays with any
trailing batch dimensions (the jumanji environment calls them with none).

Simulation rules beyond the contract (they decide what later flags see after a violation; the
plan is invalid either way): an agent that tries to leave the grid stays where it was; an agent
that enters a hole stays in it for the rest of the plan; agents in padded slots do not exist;
an agent of the board without a line in the plan stays on its start (and still blocks others).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.env import distances
from t2t_jax.env.types import DOWN, LEFT, PARSE_ERRORS, RIGHT, UNKNOWN, UP, Boards, ParseStatus, Plans, Verdicts


def move(r, c, actions, size, hole_rows, fallen):
    """One simultaneous step of all agents.

    Args:
      r, c: [A, ...] int32 rows and columns; actions: [A, ...] int action codes; size: [...]
      board sides; hole_rows: [S, ...] uint32 bit-packed holes (`distances.pack`, rows first);
      fallen: [A, ...] bool agents already in a hole (they do not move).

    Returns:
      (new_r, new_c, out_of_bounds, entered_hole), each [A, ...]; out-of-bounds moves are not
      made and entered_hole marks agents that stepped into a hole in this step.
    """
    a = actions.astype(jnp.int32)
    tr = r + (a == DOWN).astype(jnp.int32) - (a == UP).astype(jnp.int32)
    tc = c + (a == RIGHT).astype(jnp.int32) - (a == LEFT).astype(jnp.int32)
    outside = ((tr < 0) | (tr >= size) | (tc < 0) | (tc >= size)) & ~fallen
    stay = outside | fallen
    nr, nc = jnp.where(stay, r, tr), jnp.where(stay, c, tc)
    rows = jnp.take_along_axis(hole_rows, nr, axis=0) if hole_rows.ndim > 1 else hole_rows[nr]
    entered = ((rows >> nc.astype(jnp.uint32)) & 1).astype(bool) & ~fallen
    return nr, nc, outside, entered


def collisions(old_r, old_c, new_r, new_c, mask):
    """Vertex and edge collisions among the agents in `mask`.

    Args:
      old_*, new_*: [A, ...] int32 positions before and after a step; mask: [A, ...] bool.

    Returns:
      (vertex, edge): [...] bool each. Following (entering a cell its occupant leaves) and
      rotations are not edge collisions; only pairs that exchange cells are.
    """
    old = old_r * 64 + old_c  # one int per cell (grids are at most 31 wide)
    new = new_r * 64 + new_c
    vertex = edge = jnp.zeros(mask.shape[1:], bool)
    for i, j in zip(*np.triu_indices(mask.shape[0], 1)):  # each unordered pair once
        pair = mask[i] & mask[j]
        vertex |= pair & (new[i] == new[j])
        edge |= pair & (new[i] == old[j]) & (old[i] == new[j]) & (old[i] != old[j])
    return vertex, edge


def _agents_first(x):
    """[B, A, ...] -> [A, ..., B]."""
    return jnp.moveaxis(x, 0, -1)


@jax.jit
def validate(boards: Boards, plans: Plans) -> Verdicts:
    """Check a batch of plans against their boards.

    Args:
      boards: Boards [B] (S x S grids, A agent slots).
      plans: Plans [B] with actions [B, A', T]; A' may differ from A (missing slots are missing
        agents, extra present slots are unknown agents).

    Returns:
      Verdicts [B]; `optimal` needs `boards.optimal_makespan` (never optimal while UNKNOWN).
    """
    agent_mask = boards.agent_mask
    slots = agent_mask.shape[1]
    present, actions = plans.present, plans.actions
    if present.shape[1] < slots:  # a plan padded to fewer slots: the rest are missing
        present = jnp.pad(present, ((0, 0), (0, slots - present.shape[1])))
        actions = jnp.pad(actions, ((0, 0), (0, slots - actions.shape[1]), (0, 0)))
    unknown_agent = (
        plans.unknown_agent | jnp.any(present[:, slots:], axis=1) | jnp.any(present[:, :slots] & ~agent_mask, axis=1)
    )
    present, actions = present[:, :slots], actions[:, :slots]
    actions = jnp.where((present & agent_mask)[..., None], actions, 0)

    mask = _agents_first(agent_mask)  # [A, B]
    r, c = _agents_first(boards.starts[..., 0]), _agents_first(boards.starts[..., 1])
    gr, gc = _agents_first(boards.goals[..., 0]), _agents_first(boards.goals[..., 1])
    hole_rows = _agents_first(distances.pack(boards.holes))  # [S, B]
    size = boards.size

    def at_goal(r, c):
        return ((r == gr) & (c == gc)) | ~mask

    def body(carry, step_actions):
        r, c, fallen, flags, first, t, arrival = carry
        nr, nc, outside, entered = move(r, c, step_actions, size, hole_rows, fallen)
        vertex, edge = collisions(r, c, nr, nc, mask)
        step_flags = jnp.stack([jnp.any(outside & mask, 0), jnp.any(entered & mask, 0), vertex, edge])
        first = jnp.where((first == UNKNOWN) & jnp.any(step_flags, 0), t + 1, first)
        arrival = jnp.where(at_goal(nr, nc), arrival, t + 2)
        return (nr, nc, fallen | entered, flags | step_flags, first, t + 1, arrival), None

    b = size.shape[0]
    init = (
        r,
        c,
        jnp.zeros_like(mask),
        jnp.zeros((4, b), bool),
        jnp.full((b,), UNKNOWN, jnp.int32),
        jnp.int32(0),
        jnp.where(at_goal(r, c), 0, 1).astype(jnp.int32),
    )
    (r, c, _, flags, first, _, arrival), _ = jax.lax.scan(
        body, init, jnp.moveaxis(actions, 2, 0).transpose(0, 2, 1)
    )  # [T, A, B]
    goal_reached = (r == gr) & (c == gc) & mask
    all_goals = jnp.all(goal_reached | ~mask, axis=0)
    makespan = jnp.where(all_goals, jnp.max(jnp.where(mask, arrival, 0), axis=0), UNKNOWN)
    oob, hole, vertex, edge = flags
    illegal = jnp.any(flags, axis=0)
    missing = jnp.any(agent_mask & ~present, axis=1)
    parse_error = jnp.isin(plans.parse_status, jnp.array([int(s) for s in PARSE_ERRORS]))
    truncated = plans.parse_status == ParseStatus.TRUNCATED
    valid = ~illegal & all_goals & ~missing & ~unknown_agent & ~parse_error & ~truncated
    opt = boards.optimal_makespan
    return Verdicts(
        valid=valid,
        optimal=valid & (opt >= 0) & (makespan == opt),
        makespan=makespan.astype(jnp.int32),
        all_goals_reached=all_goals,
        has_illegal_moves=illegal,
        out_of_bounds=oob,
        hole=hole,
        vertex_collision=vertex,
        edge_collision=edge,
        missing_agent=missing,
        unknown_agent=unknown_agent,
        parse_error=parse_error,
        truncated=truncated,
        goal_reached=goal_reached.T,
        first_violation_step=first,
        sum_of_costs=jnp.where(all_goals, jnp.sum(jnp.where(mask, arrival, 0), axis=0), UNKNOWN).astype(jnp.int32),
    )
