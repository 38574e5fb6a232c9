"""Breadth-first search on bit-packed grids: flood fills, balls, distances, components.

A grid of side `S` is packed as `S` uint32 rows, bit `c` of row `r` being cell (r, c), so one BFS
step over a whole board is a handful of shifts and ors on `S` words (S <= 31). Functions take
arrays with any leading batch dimensions `...` and are jittable; `while_loop`s run until nothing
changes, which under `vmap` means until the slowest board of the batch has converged.
`launch/bench_env.py` measures these against dense int distance maps (`distance_maps_dense`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t2t_jax.env.types import UNKNOWN

MAX_PACKED_SIZE = 31  # one uint32 per row, with a spare bit for the left shift


def pack(mask: jax.Array) -> jax.Array:
    """[..., S, S] bool -> [..., S] uint32 rows (bit c of row r is cell (r, c))."""
    size = mask.shape[-1]
    weights = jnp.left_shift(jnp.uint32(1), jnp.arange(size, dtype=jnp.uint32))
    return jnp.sum(mask.astype(jnp.uint32) * weights, axis=-1, dtype=jnp.uint32)


def unpack(rows: jax.Array, size: int) -> jax.Array:
    """[..., S] uint32 rows -> [..., S, size] bool."""
    bits = jnp.right_shift(rows[..., None], jnp.arange(size, dtype=jnp.uint32))
    return (bits & 1).astype(bool)


def cell_rows(pos: jax.Array, size: int) -> jax.Array:
    """[..., 2] int (row, col) -> [..., S] uint32 with the single bit of that cell set."""
    row = jnp.arange(size) == pos[..., 0:1]
    bit = jnp.left_shift(jnp.uint32(1), pos[..., 1:2].astype(jnp.uint32))
    return jnp.where(row, bit, jnp.uint32(0))


def neighbours(rows: jax.Array) -> jax.Array:
    """[..., S] rows -> the cells 4-adjacent to any set cell (not masked to the grid)."""
    zero = jnp.zeros_like(rows[..., :1])
    down = jnp.concatenate([zero, rows[..., :-1]], axis=-1)  # row r-1 spreads to row r
    up = jnp.concatenate([rows[..., 1:], zero], axis=-1)
    return down | up | jnp.left_shift(rows, 1) | jnp.right_shift(rows, 1)


def step(reached: jax.Array, free: jax.Array) -> jax.Array:
    """One BFS step: [..., S] rows -> rows plus their 4-neighbours, restricted to `free`."""
    return (reached | neighbours(reached)) & free


def flood(free: jax.Array, seed: jax.Array, radius: jax.Array | int = -1):
    """Flood fill from `seed` inside `free`.

    Args:
      free: [..., S] uint32 walkable cells.
      seed: [..., S] uint32 start cells (assumed inside `free`).
      radius: [...] int, also return the ball of cells within `radius` steps (empty if < 0).

    Returns:
      (component, ball): [..., S] uint32 each; `component` is every cell reachable from `seed`.
    """
    radius = jnp.asarray(radius)
    ball0 = jnp.where((radius >= 0)[..., None], seed, jnp.uint32(0))

    def cond(carry):
        return carry[3]

    def body(carry):
        reached, ball, t, _ = carry
        new = step(reached, free)
        ball = jnp.where((t < radius)[..., None], new, ball)
        return new, ball, t + 1, jnp.any(new != reached)

    reached, ball, _, _ = jax.lax.while_loop(cond, body, (seed, ball0, jnp.zeros_like(radius), jnp.array(True)))
    return reached, ball


def pair_distance(free: jax.Array, sources: jax.Array, targets: jax.Array) -> jax.Array:
    """Shortest path lengths between cell pairs.

    Args:
      free: [..., S] uint32 walkable cells.
      sources, targets: [..., 2] int (row, col).

    Returns:
      [...] int32 number of moves from source to target, UNKNOWN (-1) if unreachable.
    """
    size = free.shape[-1]
    seed = cell_rows(sources, size) & free
    target = cell_rows(targets, size)

    def cond(carry):
        reached, _, active = carry
        return jnp.any(active)

    def body(carry):
        reached, dist, active = carry
        new = step(reached, free)
        found = jnp.any(new & target, axis=-1)
        grew = jnp.any(new != reached, axis=-1)
        dist = dist + active
        return new, dist, active & grew & ~found

    found0 = jnp.any(seed & target, axis=-1)
    reached, dist, _ = jax.lax.while_loop(
        cond, body, (seed, jnp.zeros(found0.shape, jnp.int32), ~found0 & jnp.any(seed != 0, -1))
    )
    return jnp.where(jnp.any(reached & target, axis=-1), dist, UNKNOWN)


def distance_maps(free: jax.Array, sources: jax.Array) -> jax.Array:
    """All distances from each source, by bit-packed BFS.

    Args:
      free: [..., S, S] bool walkable cells.
      sources: [..., 2] int (row, col).

    Returns:
      [..., S, S] int32 moves from the source to every cell, UNKNOWN (-1) where unreachable.
    """
    size = free.shape[-1]
    free_rows = pack(free)
    seed = cell_rows(sources, size) & free_rows

    def cond(carry):
        return carry[2]

    def body(carry):
        reached, dist, _ = carry
        new = step(reached, free_rows)
        dist = dist + ~unpack(new, size)
        return new, dist, jnp.any(new != reached)

    init = (seed, (~unpack(seed, size)).astype(jnp.int32), jnp.array(True))
    reached, dist, _ = jax.lax.while_loop(cond, body, init)
    return jnp.where(unpack(reached, size), dist, UNKNOWN)


def _min_neighbour(grid: jax.Array, fill) -> jax.Array:
    """[..., S, S] int -> the minimum over each cell's 4 neighbours (`fill` beyond the edge)."""
    row_pad = jnp.full_like(grid[..., :1, :], fill)
    col_pad = jnp.full_like(grid[..., :, :1], fill)
    above = jnp.concatenate([row_pad, grid[..., :-1, :]], -2)
    below = jnp.concatenate([grid[..., 1:, :], row_pad], -2)
    left = jnp.concatenate([col_pad, grid[..., :, :-1]], -1)
    right = jnp.concatenate([grid[..., :, 1:], col_pad], -1)
    return jnp.minimum(jnp.minimum(above, below), jnp.minimum(left, right))


def distance_maps_dense(free: jax.Array, sources: jax.Array) -> jax.Array:
    """`distance_maps` by relaxation on dense int grids (the baseline the bench compares)."""
    size = free.shape[-1]
    big = jnp.int32(size * size + 1)
    r = jnp.arange(size)
    at_source = (r[:, None] == sources[..., 0, None, None]) & (r[None, :] == sources[..., 1, None, None])
    dist0 = jnp.where(at_source & free, 0, big)

    def cond(carry):
        return carry[1]

    def body(carry):
        d, _ = carry
        new = jnp.where(free, jnp.minimum(d, _min_neighbour(d, big) + 1), big)
        return new, jnp.any(new != d)

    dist, _ = jax.lax.while_loop(cond, body, (dist0, jnp.array(True)))
    return jnp.where(dist >= big, UNKNOWN, dist)


def components(free: jax.Array) -> jax.Array:
    """Connected components of walkable cells.

    Args:
      free: [..., S, S] bool walkable cells.

    Returns:
      [..., S, S] int32, each walkable cell labelled with the smallest flat index (r * S + c) of
      its component, -1 on holes and outside the grid.
    """
    size = free.shape[-1]
    big = jnp.int32(size * size)
    labels0 = jnp.where(free, jnp.arange(size * size, dtype=jnp.int32).reshape(size, size), big)

    def body(carry):
        lab, _ = carry
        new = jnp.where(free, jnp.minimum(lab, _min_neighbour(lab, big)), big)
        return new, jnp.any(new != lab)

    labels, _ = jax.lax.while_loop(lambda c: c[1], body, (labels0, jnp.array(True)))
    return jnp.where(free, labels, -1)
