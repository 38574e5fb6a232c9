"""`Generator`: EnvConfig + PRNG key + count -> a padded batch of `Boards`, in one jitted call.

Per board (everything vmapped over boards and candidates, no Python loop over boards):

1. Axes: a bucket by weight, then N, K uniform in the bucket's integer ranges, a hole density d
   uniform in its range, and exactly H = round(d N^2) holes.
2. `candidates` independent uniform layouts (H holes among the N^2 cells, all layouts equally
   likely). In each: K distinct goals, uniform among frozen cells (among frozen cells with a
   frozen neighbour when min_distance >= 1); a bit-packed flood fill from every goal; then each
   agent's start uniform among the cells of its goal's component at shortest distance
   >= min_distance, not taken by an earlier agent's start. A candidate fails when some agent has
   no such cell. The first candidate that does not fail is the board: its law is the uniform
   layout conditioned on every agent being able to reach its goal.
3. If every candidate fails, protected corridors: each agent in turn gets a start and a goal at
   Manhattan distance >= min_distance (uniform, distinct), joined by a random monotone lattice
   path; the union of the paths stays frozen and the H holes fall uniformly on the other cells.
   A monotone path is a shortest path whatever the holes, so each agent's distance is exactly
   its Manhattan distance (no detours: this tier is easier than the candidates' law). It fails
   when the paths cover more than the N^2 - H frozen cells.
4. If that fails too, the line, which cannot fail for a bucket `EnvConfig` accepts: one random
   monotone path of L = min_distance + K - 1 moves stays frozen, agent i starts on its i-th cell
   and has its goal min_distance cells further on, and the holes fall on the other cells. Every
   distance is exactly min_distance, and all agents walking forward together is a
   conflict-free joint plan of makespan min_distance.

`Generator.sample` also returns which tier made each board (candidate index, CORRIDORS, LINE);
`python -m launch.mapf stats` prints the per-bucket acceptance rates (docs/environment.md, "Board
distribution"). Joint feasibility of candidate boards is settled later by certification.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.env import distances
from t2t_jax.env.config import EnvConfig, hole_count
from t2t_jax.env.types import UNKNOWN, Boards, inside

PAD_BUCKETS = 8  # the bucket axis is padded to a multiple of this (see Generator)
CORRIDORS = -1  # GenInfo.source of boards made by tier 3
LINE = -2  # ... and by tier 4


@chex.dataclass(frozen=True)
class GenInfo:
    """Per-board generation record. source: [B] int32 candidate index, or CORRIDORS / LINE for
    the fallback tiers. density: [B] float32, the hole density drawn before rounding."""

    source: chex.Array
    density: chex.Array


class Generator:
    """Callable `generator(key, num) -> Boards`, jumanji style.

    Args:
      config: the mixture to draw from. Its numbers are arguments of one module-level jitted
        function, and the bucket axis is padded to a multiple of PAD_BUCKETS (weight 0), so every
        config with the same padding (max_size, max_agents) and up to PAD_BUCKETS buckets
        shares one compilation (a stage loop whose engineer edits the buckets compiles once).
      candidates: uniform layouts tried per board before the corridor fallback (each one after
        the first costs only in batches where some board still needs it).
    """

    def __init__(self, config: EnvConfig, candidates: int = 8):
        self.config = config
        self.candidates = candidates
        b = config.buckets
        b = b + (b[0],) * (-len(b) % PAD_BUCKETS)  # padding buckets, never drawn
        weights = np.zeros(len(b))
        weights[: len(config.buckets)] = config.weights
        with np.errstate(divide="ignore"):
            log_w = np.log(weights).astype(np.float32)
        self.axes = {
            "log_w": log_w,
            "size": np.array([x.size for x in b], np.int32),
            "agents": np.array([x.agents for x in b], np.int32),
            "density": np.array([x.hole_density for x in b], np.float32),
            "min_distance": np.array([x.min_distance for x in b], np.int32),
        }
        self._static = dict(max_size=config.max_size, max_agents=config.max_agents, candidates=candidates)

    def __call__(self, key: jax.Array, num: int) -> Boards:
        return self.sample(key, num)[0]

    def sample(self, key: jax.Array, num: int) -> tuple[Boards, GenInfo]:
        """key: a PRNG key; num: static batch size -> (Boards [num], GenInfo [num])."""
        return sample(key, self.axes, num=num, **self._static)

    def one(self, key: jax.Array) -> Boards:
        """One board without a batch dimension (traceable; what the jumanji env resets to)."""
        return jax.tree.map(lambda x: x[0], _build(key[None], self.axes, **self._static)[0])


@functools.partial(jax.jit, static_argnames=("num", "max_size", "max_agents", "candidates"))
def sample(key, axes, num, max_size, max_agents, candidates):
    """The jitted generator: `axes` (Generator.axes, bucket parameters as arrays) are traced."""
    return _build(jax.random.split(key, num), axes, max_size, max_agents, candidates)


def _axes_of(axes, key):
    """Draw one board's bucket and axes (n, k, d, m, holes)."""
    ax = {k: jnp.asarray(v) for k, v in axes.items()}
    k_b, k_n, k_k, k_d = jax.random.split(key, 4)
    bucket = jax.random.categorical(k_b, ax["log_w"]).astype(jnp.int32)
    n = jax.random.randint(k_n, (), ax["size"][bucket, 0], ax["size"][bucket, 1] + 1)
    k = jax.random.randint(k_k, (), ax["agents"][bucket, 0], ax["agents"][bucket, 1] + 1)
    d = jax.random.uniform(k_d, (), minval=ax["density"][bucket, 0], maxval=ax["density"][bucket, 1])
    return dict(bucket=bucket, n=n, k=k, d=d, m=ax["min_distance"][bucket], h=hole_count(d, n).astype(jnp.int32))


def _build(keys, axes, max_size, max_agents, candidates):
    """keys [B] -> (Boards [B], GenInfo [B]). Tiers run in order, each only for batches in
    which some board is still unplaced (a batch-level `cond`), so easy batches pay for one
    candidate and hard ones for as many tiers as their hardest board needs."""
    s, a = max_size, max_agents
    b = keys.shape[0]
    ax = jax.vmap(functools.partial(_axes_of, axes))(jax.vmap(lambda x: jax.random.fold_in(x, 0))(keys))
    grid = inside(ax["n"], s)
    kw = dict(grid=grid, n=ax["n"], n_holes=ax["h"], k=ax["k"], m=ax["m"])
    picked = {
        "holes": jnp.zeros((b, s, s), bool),
        "starts": jnp.zeros((b, a, 2), jnp.int32),
        "goals": jnp.zeros((b, a, 2), jnp.int32),
    }
    unplaced = LINE - 1

    def attempt(fn, code, tier, picked, source):
        tier_keys = jax.vmap(lambda x: jax.random.fold_in(x, tier + 1))(keys)
        out = jax.vmap(functools.partial(fn, a=a))(tier_keys, **kw)
        take = (source == unplaced) & out["ok"]
        new = {f: jnp.where(take.reshape((-1,) + (1,) * (v.ndim - 1)), out[f], v) for f, v in picked.items()}
        return new, jnp.where(take, code, source)

    def candidate(carry):  # one compiled body for every candidate
        i, picked, source = carry
        return (i + 1,) + attempt(_candidate, i, i, picked, source)

    _, picked, source = jax.lax.while_loop(
        lambda c: (c[0] < candidates) & jnp.any(c[2] == unplaced),
        candidate,
        (jnp.int32(0), picked, jnp.full((b,), unplaced, jnp.int32)),
    )
    for tier, (code, fn) in enumerate([(CORRIDORS, _corridors), (LINE, _line)]):
        picked, source = jax.lax.cond(
            jnp.any(source == unplaced),
            functools.partial(attempt, fn, code, candidates + tier),
            lambda p, q: (p, q),
            picked,
            source,
        )

    mask = jnp.arange(a) < ax["k"][:, None]
    free_rows = distances.pack(grid & ~picked["holes"])
    dist = distances.pair_distance(jnp.broadcast_to(free_rows[:, None], (b, a, s)), picked["starts"], picked["goals"])
    boards = Boards(
        size=ax["n"],
        holes=picked["holes"],
        starts=picked["starts"],
        goals=picked["goals"],
        agent_mask=mask,
        bucket=ax["bucket"],
        lower_bound=jnp.max(jnp.where(mask, dist, 0), axis=1),
        optimal_makespan=jnp.full((b,), UNKNOWN, jnp.int32),
    )
    return boards, GenInfo(source=source, density=ax["d"])


def _drop_holes(key, grid, n_holes, protected):
    """Exactly `n_holes` holes uniformly among cells of `grid` [S, S] outside `protected`."""
    s = grid.shape[-1]
    idx = jnp.arange(s * s, dtype=jnp.uint32)
    # Random high bits, the cell index in the low 10 bits: distinct keys, so exactly n_holes win.
    score = (jax.random.bits(key, (s * s,), jnp.uint32) & jnp.uint32(~1023 & 0xFFFFFFFF)) | idx
    eligible = (grid & ~protected).reshape(-1)
    score = jnp.where(eligible, score, jnp.uint32(0xFFFFFFFF))
    threshold = jnp.sort(score)[jnp.maximum(n_holes - 1, 0)]
    return ((score <= threshold) & eligible & (n_holes > 0)).reshape(s, s)


def _flat_to_pos(flat, s):
    return jnp.stack([flat // s, flat % s], axis=-1).astype(jnp.int32)


def _pick(u, mask):
    """Uniform choice among the set entries of `mask` [M] bool, by rank, with one uniform `u`.
    Returns (index, any): the index is 0 when nothing is set."""
    count = jnp.sum(mask)
    rank = jnp.minimum((u * count).astype(jnp.int32), count - 1)
    return jnp.argmax(jnp.cumsum(mask) > rank), count > 0


def _candidate(key, grid, n, n_holes, k, m, a):
    """One uniform layout and an attempt to place k agents on it (see the module docstring)."""
    s = grid.shape[-1]
    k_h, k_u = jax.random.split(key)
    holes = _drop_holes(k_h, grid, n_holes, jnp.zeros_like(grid))
    free = grid & ~holes
    free_rows = distances.pack(free)
    goal_ok = jnp.where(m >= 1, distances.neighbours(free_rows) & free_rows, free_rows)
    goal_ok = distances.unpack(goal_ok, s).reshape(-1)
    u = jax.random.uniform(k_u, (2, a))
    active = jnp.arange(a) < k
    cells = jnp.arange(s * s)

    def place(u_row, allowed):
        """Distinct cells for the active slots; allowed: [A, S*S] bool -> ([A, 2] pos, ok)."""
        used = jnp.zeros((s * s,), bool)
        ok, pos = jnp.array(True), []
        for i in range(a):  # static loop over agent slots: each excludes the earlier ones' cells
            flat, found = _pick(u_row[i], allowed[i] & ~used)
            ok &= ~active[i] | found
            used = used | ((cells == flat) & active[i])
            pos.append(jnp.where(active[i], _flat_to_pos(flat, s), 0))
        return jnp.stack(pos), ok

    goals, goals_ok = place(u[0], jnp.broadcast_to(goal_ok, (a, s * s)))
    seed = distances.cell_rows(goals, s) & jnp.where(active[:, None], free_rows, 0)
    comp, ball = distances.flood(jnp.broadcast_to(free_rows, (a, s)), seed, jnp.full((a,), m - 1))
    starts, starts_ok = place(u[1], distances.unpack(comp & ~ball, s).reshape(a, s * s))
    return {"holes": holes, "starts": starts, "goals": goals, "ok": goals_ok & starts_ok}


def _monotone_path(u, start, steps):
    """A uniformly random shortest lattice path from `start` [2] taking `steps` [2] signed
    (rows, cols) moves, drawn with uniforms `u` [M] -> [M + 1, 2] cells (M >= the number of
    moves), the last cell repeated past the end."""
    max_moves = u.shape[0]
    moves = jnp.abs(steps).sum()
    real = jnp.arange(max_moves) < moves
    order = jnp.argsort(jnp.where(real, u, 2.0))
    vertical = jnp.zeros((max_moves,), bool).at[order].set(jnp.arange(max_moves) < jnp.abs(steps[0]))
    delta = jnp.stack(
        [jnp.where(real & vertical, jnp.sign(steps[0]), 0), jnp.where(real & ~vertical, jnp.sign(steps[1]), 0)], -1
    )
    return start + jnp.concatenate([jnp.zeros((1, 2), jnp.int32), jnp.cumsum(delta, 0)])


def _path_cells(path, s):
    """[L, 2] cells -> [S, S] bool."""
    return jnp.zeros((s, s), bool).at[path[:, 0], path[:, 1]].set(True)


def _corridors(key, grid, n, n_holes, k, m, a):
    """Tier 3 of the module docstring: per-agent protected monotone corridors; may fail."""
    s = grid.shape[-1]
    r, c = jnp.meshgrid(jnp.arange(s), jnp.arange(s), indexing="ij")
    cells = jnp.stack([r.reshape(-1), c.reshape(-1)], -1)
    flat_grid = grid.reshape(-1)
    k_u, k_h = jax.random.split(key)
    u = jax.random.uniform(k_u, (a, 2 + 2 * (s - 1)))  # per slot: start, goal, path
    # Cells with some grid cell at Manhattan distance >= m (the farthest one is a corner).
    reach = jnp.maximum(cells[:, 0], n - 1 - cells[:, 0]) + jnp.maximum(cells[:, 1], n - 1 - cells[:, 1])
    has_goal = flat_grid & (reach >= m)
    used_s = jnp.zeros((s * s,), bool)
    used_g = jnp.zeros((s * s,), bool)
    protected = jnp.zeros((s, s), bool)
    ok = jnp.array(True)
    starts, goals = [], []
    for i in range(a):  # static loop over agent slots
        active = i < k
        s_flat, found_s = _pick(u[i, 0], has_goal & ~used_s)
        far = jnp.abs(cells - cells[s_flat]).sum(-1) >= m
        g_flat, found_g = _pick(u[i, 1], flat_grid & ~used_g & far)
        ok &= ~active | (found_s & found_g)
        start, goal = cells[s_flat], cells[g_flat]
        path = _monotone_path(u[i, 2:], start, goal - start)
        protected |= _path_cells(path, s) & active
        used_s |= (jnp.arange(s * s) == s_flat) & active
        used_g |= (jnp.arange(s * s) == g_flat) & active
        starts.append(jnp.where(active, start, 0))
        goals.append(jnp.where(active, goal, 0))
    ok &= jnp.sum(protected) <= n * n - n_holes
    holes = _drop_holes(k_h, grid, n_holes, protected)
    return {"holes": holes, "starts": jnp.stack(starts), "goals": jnp.stack(goals), "ok": ok}


def _line(key, grid, n, n_holes, k, m, a):
    """Tier 4 of the module docstring; cannot fail for a legal bucket."""
    s = grid.shape[-1]
    max_moves = 2 * (s - 1)
    k_u, k_h = jax.random.split(key)
    u = jax.random.uniform(k_u, (5 + max_moves,))
    moves = m + k - 1

    def uniform_int(x, lo, hi):  # uniform integer in [lo, hi)
        return lo + jnp.minimum((x * (hi - lo)).astype(jnp.int32), hi - lo - 1)

    dr = uniform_int(u[0], jnp.maximum(0, moves - (n - 1)), jnp.minimum(moves, n - 1) + 1)
    dc = moves - dr
    sign = jnp.where(u[1:3] < 0.5, 1, -1)
    r0 = uniform_int(u[3], 0, n - dr) + jnp.where(sign[0] < 0, dr, 0)
    c0 = uniform_int(u[4], 0, n - dc) + jnp.where(sign[1] < 0, dc, 0)
    path = _monotone_path(u[5:], jnp.stack([r0, c0]), sign * jnp.stack([dr, dc]))
    holes = _drop_holes(k_h, grid, n_holes, _path_cells(path, s))
    slot = jnp.arange(a)
    active = (slot < k)[:, None]
    starts = jnp.where(active, path[jnp.minimum(slot, max_moves)], 0)
    goals = jnp.where(active, path[jnp.minimum(slot + m, max_moves)], 0)
    return {"holes": holes, "starts": starts, "goals": goals, "ok": jnp.array(True)}
