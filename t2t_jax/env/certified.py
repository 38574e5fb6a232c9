"""`CertifiedGenerator`: boards that leave generation solvable, with a certified optimum.

Pipeline, per chunk of boards: generate on device -> `certify` on device (lower bound,
prioritized-planning upper bound) -> boards whose bounds differ go to the exact SAT solver in
a pool of worker processes -> boards with no joint plan within the horizon are dropped and
replaced from later chunks. The next chunk is generated and certified on device while the
workers solve the current one, so the device does not wait for the host. `last_stats.replaced`
counts, per bucket, the boards generated and dropped in the chunks used (the engineer's account
shows the share replaced).

Results depend on (key, chunk): chunk i is drawn with `fold_in(key, i)`, so chunks can be
certified apart (`chunk_boards`: the hosts of a pod deal them round-robin) and joined in order.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from t2t_jax.env import io, solver
from t2t_jax.env.certify import certify_jit
from t2t_jax.env.config import EnvConfig
from t2t_jax.env.generator import Generator
from t2t_jax.env.types import Boards, Plans


@dataclasses.dataclass
class CertifyStats:
    """What one `sample` call did."""

    generated: int = 0
    certified_on_device: int = 0
    solved_on_host: int = 0
    infeasible: int = 0
    solver_seconds: list = dataclasses.field(default_factory=list)
    # Per bucket (its id as a string), over the chunks whose boards were used: boards generated and
    # boards dropped as infeasible (replaced by boards of later chunks). `merge_replaced` adds two.
    replaced: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        t = np.array(self.solver_seconds or [np.nan])
        return {
            "generated": self.generated,
            "certified_on_device": self.certified_on_device,
            "solved_on_host": self.solved_on_host,
            "infeasible": self.infeasible,
            "device_fraction": self.certified_on_device / max(self.generated, 1),
            "solver_median_s": float(np.nanmedian(t)),
            "solver_p95_s": float(np.nanpercentile(t, 95)),
        }


class CertifiedGenerator:
    """Callable `gen(key, num) -> (Boards, witness Plans)` with `optimal_makespan` filled.

    Args:
      config: the EnvConfig to draw from.
      horizon: plan horizon H (witness plans are [num, A, H]; longer optima count as infeasible).
      num_orders: priority orders for the device upper bound.
      chunk: boards per device call.
      pool: a `solver.make_pool()` executor, or None to solve in this process.
    """

    def __init__(self, config: EnvConfig, horizon: int = 64, num_orders: int = 8, chunk: int = 512, pool=None):
        self.config = config
        self.generator = Generator(config)
        self.horizon, self.num_orders, self.chunk, self.pool = horizon, num_orders, chunk, pool
        self.last_stats = CertifyStats()

    def __call__(self, key: jax.Array, num: int, check=None) -> tuple[Boards, Plans]:
        return self.sample(key, num, check)

    def _device_chunk(self, key, i):
        boards = self.generator(jax.random.fold_in(key, i), self.chunk)
        bounds = certify_jit(boards, horizon=self.horizon, num_orders=self.num_orders)
        return jax.device_get((boards, bounds))

    def _submit(self, boards, bounds):
        """Start the host solver on the uncertified boards of a chunk."""
        todo = np.flatnonzero(~bounds.certified)
        jobs = [(io.board_to_json(boards, int(i)), int(bounds.upper[i]), self.horizon) for i in todo]
        if self.pool is None:
            return todo, [solver.solve_job(j) for j in jobs]
        return todo, [self.pool.submit(solver.solve_job, j) for j in jobs]

    def _finish(self, boards, bounds, todo, pending, stats):
        """-> (kept indices, optimal makespans, witness action arrays) of one chunk."""
        solutions = [p if isinstance(p, solver.Solution) else p.result() for p in pending]
        optimum = np.where(bounds.certified, bounds.upper, -1).astype(np.int32)
        actions = np.array(bounds.plans.actions)
        a = actions.shape[1]
        bucket = np.asarray(boards.bucket)
        counts = {str(b): {"generated": int(n), "replaced": 0} for b, n in enumerate(np.bincount(bucket)) if n}
        for i, sol in zip(todo, solutions):
            stats.solver_seconds.append(sol.seconds)
            if sol.optimal_makespan is None:
                stats.infeasible += 1
                counts[str(bucket[i])]["replaced"] += 1
                continue
            stats.solved_on_host += 1
            optimum[i] = sol.optimal_makespan
            actions[i] = io.plans_from_lists([sol.plan], a, self.horizon).actions[0]
        stats.certified_on_device += int(bounds.certified.sum())
        stats.replaced = merge_replaced(stats.replaced, counts)
        keep = np.flatnonzero(optimum >= 0)
        return keep, optimum, actions

    def chunk_boards(self, key: jax.Array, i: int) -> tuple[Boards, Plans]:
        """Chunk i's boards that stay (every feasible one), certified, without overlap: the
        unit the hosts of a pod deal among themselves (chunks in order, then cut to the number
        wanted, are `sample`'s boards). Stats in `self.last_stats`."""
        stats = CertifyStats(generated=self.chunk)
        boards, bounds = self._device_chunk(key, i)
        todo, pending = self._submit(boards, bounds)
        part = (boards, bounds, *self._finish(boards, bounds, todo, pending, stats))
        self.last_stats = stats
        return _assemble([part], self.chunk)

    def sample(self, key: jax.Array, num: int, check=None) -> tuple[Boards, Plans]:
        """-> (Boards [num] with lower_bound and optimal_makespan, witness Plans [num, A, H]).
        Stats of the call are in `self.last_stats`. `check()`, when given, is called before each
        chunk and may raise to stop early (the stage loop's SIGTERM); queued solver jobs are
        cancelled either way."""
        stats = CertifyStats()
        queue = collections.deque()
        parts, have, i = [], 0, 0
        try:
            while have < num:
                # Keep one chunk in flight on the host while the device makes the next, unless the
                # chunks already started should be enough (about 1 board in 40 is infeasible).
                while not queue or (len(queue) < 2 and have + 0.95 * self.chunk * len(queue) < num):
                    if check is not None:
                        check()
                    boards, bounds = self._device_chunk(key, i)
                    stats.generated += self.chunk
                    queue.append((boards, bounds) + self._submit(boards, bounds))
                    i += 1
                boards, bounds, todo, pending = queue.popleft()
                keep, optimum, actions = self._finish(boards, bounds, todo, pending, stats)
                parts.append((boards, bounds, keep, optimum, actions))
                have += len(keep)
        finally:
            for q in queue:  # prefetched work that is not needed
                for p in q[3]:
                    if not isinstance(p, solver.Solution):
                        p.cancel()
        self.last_stats = stats
        return _assemble(parts, num)


def merge_replaced(a: dict, b: dict) -> dict:
    """Two `CertifyStats.replaced` counts added, by bucket."""
    out = {k: dict(v) for k, v in a.items()}
    for bucket, c in b.items():
        t = out.setdefault(bucket, {"generated": 0, "replaced": 0})
        t["generated"] += c["generated"]
        t["replaced"] += c["replaced"]
    return out


def _assemble(parts, num):
    boards = [jax.tree.map(lambda x, k=keep: x[k], b) for b, _, keep, _, _ in parts]
    boards = jax.tree.map(lambda *x: np.concatenate(x)[:num], *boards)
    optimum = np.concatenate([o[keep] for _, _, keep, o, _ in parts])[:num]
    lower = np.concatenate([bd.lower[keep] for _, bd, keep, _, _ in parts])[:num]
    actions = np.concatenate([act[keep] for _, _, keep, _, act in parts])[:num]
    boards = boards.replace(optimal_makespan=optimum, lower_bound=lower)
    mask = np.asarray(boards.agent_mask)
    steps = np.arange(1, actions.shape[-1] + 1)
    lengths = np.max(np.where(actions != 0, steps, 0), axis=-1).astype(np.int32)
    plans = Plans(
        actions=actions,
        lengths=lengths,
        present=mask,
        parse_status=np.zeros(len(optimum), np.int32),
        unknown_agent=np.zeros(len(optimum), bool),
    )
    return boards, plans
