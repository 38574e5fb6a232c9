"""Bounds on the optimal makespan, on device: `certify(boards) -> Bounds`.

- Lower bound: the largest single-agent shortest distance (BFS).
- Upper bound: prioritized planning in space-time over several priority orders at once
  (vmapped), keeping the best. Each agent in turn takes the earliest arrival that avoids the
  cells and swaps of the agents before it, where arriving means reaching its goal at a time
  after which no earlier agent passes through that goal; it then reserves its whole path and
  its goal for the rest of the horizon. Everything is bit-packed (`distances.py`): the set of
  cells an agent can occupy at time t is `S` words, one BFS layer per step.
- Where upper bound == lower bound the optimum is certified, with the witness plan.

Boards whose bounds differ (or where no order finds a plan within the horizon) go to the exact
host solver in solver.py.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.env import distances
from t2t_jax.env.types import DOWN, LEFT, RIGHT, STAY, UNKNOWN, UP, Boards, Plans

DIRECTIONS = (UP, DOWN, LEFT, RIGHT)
REVERSE = {UP: DOWN, DOWN: UP, LEFT: RIGHT, RIGHT: LEFT}


@chex.dataclass(frozen=True)
class Bounds:
    """lower: [B] int32; upper: [B] int32 (UNKNOWN when no order found a plan); certified:
    [B] bool (upper == lower); plans: Plans [B] with actions [B, A, H], the best order's plan
    (all STAY where upper is UNKNOWN)."""

    lower: chex.Array
    upper: chex.Array
    certified: chex.Array
    plans: Plans


def _shift(rows, direction):
    """Where the cells of `rows` [S] land after one move in `direction` (unmasked)."""
    zero = jnp.zeros_like(rows[:1])
    if direction == UP:
        return jnp.concatenate([rows[1:], zero])
    if direction == DOWN:
        return jnp.concatenate([zero, rows[:-1]])
    if direction == LEFT:
        return jnp.right_shift(rows, 1)
    return jnp.left_shift(rows, 1)


def _bit(rows, pos):
    return (jnp.right_shift(rows[pos[0]], pos[1].astype(jnp.uint32)) & 1).astype(bool)


_DELTA = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], np.int32)  # by action code


def _plan_agent(free, vertex, forbid, start, goal, horizon):
    """Earliest conflict-free path of one agent given the reservations.

    Args:
      free: [S] uint32 walkable cells; vertex: [H + 1, S] cells reserved at each time;
      forbid: [4, H, S] cells from which a move in DIRECTIONS[d] at time t is forbidden;
      start, goal: [2] int32.

    Returns:
      (found [] bool, arrival [] int32, path [H + 1, 2] positions, actions [H] int8).
    """
    size = free.shape[0]
    reach0 = distances.cell_rows(start, size) & ~vertex[0]

    def forward(reach, t):
        moved = reach
        for d, direction in enumerate(DIRECTIONS):
            moved = moved | _shift(reach & ~forbid[d, t], direction)
        nxt = moved & free & ~vertex[t + 1]
        return nxt, nxt

    _, later = jax.lax.scan(forward, reach0, jnp.arange(horizon))
    reach = jnp.concatenate([reach0[None], later])  # [H + 1, S]
    at_goal = jax.vmap(_bit, in_axes=(0, None))(reach, goal)
    taken = jax.vmap(_bit, in_axes=(0, None))(vertex, goal)
    clear = ~jnp.flip(jnp.cumsum(jnp.flip(taken)) > 0)  # goal free from t to the horizon
    ok = at_goal & clear
    found = jnp.any(ok)
    arrival = jnp.argmax(ok).astype(jnp.int32)

    def backward(cur, t):
        """Predecessor of `cur` at time t (cur is where the agent is at t + 1)."""
        options = cur[None] - jnp.asarray(_DELTA)  # predecessor if the action was code c
        allowed = [_bit(reach[t], options[0])]
        for d, direction in enumerate(DIRECTIONS):
            p = options[direction]
            inside = jnp.all((p >= 0) & (p < size))
            p = jnp.clip(p, 0, size - 1)
            allowed.append(inside & _bit(reach[t], p) & ~_bit(forbid[d, t], p))
        code = jnp.argmax(jnp.stack(allowed))
        prev = jnp.where(t < arrival, options[code], cur)
        return prev, (prev, jnp.where(t < arrival, code, STAY).astype(jnp.int8))

    _, (prevs, codes) = jax.lax.scan(backward, goal, jnp.arange(horizon), reverse=True)
    path = jnp.concatenate([prevs, goal[None]])  # prevs[t] = position at time t
    return found, arrival, path, codes


def _reserve(vertex, forbid, path, actions, size):
    """Add an agent's path to the reservations."""
    cells = distances.cell_rows(path, size)  # [H + 1, S]
    vertex = vertex | cells
    for d, direction in enumerate(DIRECTIONS):
        # A later agent may not make the reverse move at the same time (a swap).
        mover = (actions == REVERSE[direction])[:, None]
        forbid = forbid.at[d].set(forbid[d] | jnp.where(mover, cells[1:], 0))
    return vertex, forbid


def _prioritized(free, starts, goals, mask, order, horizon):
    """One priority order on one board -> (ok, makespan, actions [A, H] int8)."""
    size = free.shape[0]
    a = starts.shape[0]
    vertex = jnp.zeros((horizon + 1, size), jnp.uint32)
    forbid = jnp.zeros((4, horizon, size), jnp.uint32)
    actions = jnp.zeros((a, horizon), jnp.int8)
    ok, makespan = jnp.array(True), jnp.int32(0)
    for p in range(a):  # static loop over priority positions
        i = order[p]
        found, arrival, path, acts = _plan_agent(free, vertex, forbid, starts[i], goals[i], horizon)
        active = mask[i]
        use = active & found
        new_vertex, new_forbid = _reserve(vertex, forbid, path, acts, size)
        vertex = jnp.where(use, new_vertex, vertex)
        forbid = jnp.where(use, new_forbid, forbid)
        actions = actions.at[i].set(jnp.where(use, acts, actions[i]))
        ok &= ~active | found
        makespan = jnp.maximum(makespan, jnp.where(use, arrival, 0))
    return ok, makespan, actions


def priority_orders(key, lower_dists, mask, num_orders):
    """[B, P, A] int32 priority orders: identity, longest distance first, shortest first,
    reverse, then random permutations of the agent slots."""
    b, a = lower_dists.shape
    keyed = jnp.where(mask, lower_dists, -1)
    fixed = [
        jnp.broadcast_to(jnp.arange(a), (b, a)),
        jnp.argsort(-keyed, axis=1, stable=True),
        jnp.argsort(jnp.where(mask, lower_dists, 10**6), axis=1, stable=True),
        jnp.broadcast_to(jnp.arange(a)[::-1], (b, a)),
    ]
    rand = jnp.argsort(jax.random.uniform(key, (b, max(num_orders - len(fixed), 0), a)), axis=-1)
    return jnp.concatenate([jnp.stack(fixed[:num_orders], 1), rand], axis=1).astype(jnp.int32)


def certify(boards: Boards, horizon: int = 64, num_orders: int = 8, key=None) -> Bounds:
    """Lower and upper bounds of the optimal makespan for every board (jit-friendly).

    Args:
      boards: Boards [B].
      horizon: static plan length H; plans longer than this are not searched.
      num_orders: priority orders tried per board (vmapped).
      key: PRNG key for the random orders (a fixed key when None: deterministic).

    Returns:
      Bounds [B].
    """
    key = jax.random.key(0) if key is None else key
    s, a = boards.max_size, boards.max_agents
    free = distances.pack(boards.free())  # [B, S]
    dists = distances.pair_distance(jnp.broadcast_to(free[:, None], (free.shape[0], a, s)), boards.starts, boards.goals)
    mask = boards.agent_mask
    lower = jnp.max(jnp.where(mask, dists, 0), axis=1)
    orders = priority_orders(key, dists, mask, num_orders)
    per_order = jax.vmap(
        jax.vmap(_prioritized, in_axes=(None, None, None, None, 0, None)), in_axes=(0, 0, 0, 0, 0, None)
    )
    ok, makespan, actions = per_order(free, boards.starts, boards.goals, mask, orders, horizon)
    score = jnp.where(ok, makespan, horizon + 1)
    best = jnp.argmin(score, axis=1)
    found = jnp.any(ok, axis=1)
    upper = jnp.where(found, jnp.min(score, axis=1), UNKNOWN).astype(jnp.int32)
    best_actions = jnp.where(found[:, None, None], actions[jnp.arange(actions.shape[0]), best], 0)
    b = boards.size.shape[0]
    plans = Plans(
        actions=best_actions,
        lengths=jnp.where(mask, upper[:, None], 0).astype(jnp.int32),
        present=mask,
        parse_status=jnp.zeros((b,), jnp.int32),
        unknown_agent=jnp.zeros((b,), bool),
    )
    return Bounds(lower=lower.astype(jnp.int32), upper=upper, certified=found & (upper == lower), plans=plans)


certify_jit = jax.jit(certify, static_argnames=("horizon", "num_orders"))
