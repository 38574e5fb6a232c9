"""Exact optimal makespan on the host: a SAT encoding solved with CaDiCaL (python-sat).

For a makespan T the time-expanded graph has a variable x[i, v, t] for each agent i, time
t <= T and cell v the agent can be in at t and still reach its goal by T (BFS distances from its
start and to its goal). Clauses: the start at t = 0, the goal at t = T, every occupied cell has an
occupied successor (stay or a neighbour), no two agents in one cell at one time, no two agents
exchanging cells in one step. Any model contains a conflict-free joint plan (followed forward
from the starts); any plan of makespan <= T is a model, so the first satisfiable T from the
lower bound up is the optimum. Waiting on the goal keeps a plan valid, so satisfiability is
monotone in T.

Proving that no plan exists at all (T = the horizon) can be hard for SAT (agents that would have
to swap in a corridor are a pigeonhole-like problem), so when prioritized planning found no
plan and the joint search is small (free cells ^ agents x 5 ^ agents <= `JOINT_WORK`), feasibility
is first settled by a vectorised breadth-first search over joint configurations (`joint_reachable`).

This module imports no JAX so worker processes start fast (see `solve_many`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import itertools
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from pysat.solvers import Solver

from t2t_jax.env.reference import bfs

MOVES = {(0, 0): "STAY", (-1, 0): "UP", (1, 0): "DOWN", (0, -1): "LEFT", (0, 1): "RIGHT"}
SAT_ENGINE = "cadical195"
JOINT_WORK = 40_000_000  # joint states x joint moves: the bound on the joint search's work
JOINT_CHUNK = 1 << 20  # (state, joint move) pairs expanded at once: bounds the memory


@dataclasses.dataclass
class Solution:
    """optimal_makespan: the optimum, or None when no plan exists within `max_makespan`;
    plan: per-agent action-name lists (the witness); seconds: wall time; solves: SAT calls."""

    optimal_makespan: int | None
    lower_bound: int | None
    plan: list[list[str]] | None
    seconds: float
    solves: int


def _neighbours(cell, n, holes):
    r, c = cell
    for dr, dc in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)):
        nxt = (r + dr, c + dc)
        if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in holes:
            yield nxt


def joint_reachable(board: dict, max_makespan: int) -> bool | None:
    """Whether the goal configuration is reachable within `max_makespan` joint steps (BFS over
    joint configurations, vertex and swap conflicts excluded); None when free cells ^ agents x
    5 ^ agents exceeds JOINT_WORK."""
    n, holes = board["size"], {tuple(h) for h in board["holes"]}
    cells = [(r, c) for r in range(n) for c in range(n) if (r, c) not in holes]
    m, k = len(cells), len(board["starts"])
    if (m * 5) ** k > JOINT_WORK:
        return None
    index = {cell: i for i, cell in enumerate(cells)}
    nb = np.full((m, 5), -1, np.int64)  # cell, action -> cell (-1: off the grid or a hole)
    for i, (r, c) in enumerate(cells):
        for a, (dr, dc) in enumerate(MOVES):
            nb[i, a] = index.get((r + dr, c + dc), -1)
    moves = np.array(list(itertools.product(range(5), repeat=k)), np.int64)  # [5^k, k]
    base = m ** np.arange(k, dtype=np.int64)
    goal = int(sum(index[tuple(g)] * base[i] for i, g in enumerate(board["goals"])))
    frontier = np.array([sum(index[tuple(s)] * base[i] for i, s in enumerate(board["starts"]))])
    seen = np.zeros(m**k, bool)
    seen[frontier] = True
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    for _ in range(max_makespan):
        if seen[goal]:
            return True
        found = []
        step = max(1, JOINT_CHUNK // len(moves))
        for lo in range(0, len(frontier), step):
            pos = (frontier[lo : lo + step, None] // base) % m  # [F, k]
            new = nb[pos[:, None, :], moves[None]]  # [F, 5^k, k]
            ok = (new >= 0).all(-1)
            for i, j in pairs:
                ok &= new[..., i] != new[..., j]
                ok &= ~((new[..., i] == pos[:, None, j]) & (new[..., j] == pos[:, None, i]))
            found.append(np.unique((new * base).sum(-1)[ok]))
        codes = np.unique(np.concatenate(found))
        frontier = codes[~seen[codes]]
        if frontier.size == 0:
            return False
        seen[frontier] = True
    return bool(seen[goal])


def _solve_at(board, horizon, from_start, to_goal):
    """The plan of makespan <= horizon, or None if there is none."""
    n = board["size"]
    holes = {tuple(h) for h in board["holes"]}
    k = len(board["starts"])
    var = {}
    for i in range(k):
        for t in range(horizon + 1):
            for v, d in from_start[i].items():
                if d <= t and to_goal[i].get(v, horizon + 1) <= horizon - t:
                    var[i, v, t] = len(var) + 1
    clauses = []
    for i in range(k):
        clauses.append([var[i, tuple(board["starts"][i]), 0]])
        clauses.append([var[i, tuple(board["goals"][i]), horizon]])
    by_cell_time = {}
    for (i, v, t), x in var.items():
        by_cell_time.setdefault((v, t), []).append(x)
        if t < horizon:
            clauses.append([-x] + [var[i, u, t + 1] for u in _neighbours(v, n, holes) if (i, u, t + 1) in var])
    for xs in by_cell_time.values():  # vertex conflicts
        clauses.extend([-a, -b] for j, a in enumerate(xs) for b in xs[j + 1 :])
    for (i, u, t), a in var.items():  # swap conflicts: i moves u -> v while j moves v -> u
        if t == horizon:
            continue
        for v in _neighbours(u, n, holes):
            if v == u or (i, v, t + 1) not in var:
                continue
            b = var[i, v, t + 1]
            for j in range(i + 1, k):
                c, d = var.get((j, v, t)), var.get((j, u, t + 1))
                if c and d:
                    clauses.append([-a, -b, -c, -d])
    with Solver(name=SAT_ENGINE, bootstrap_with=clauses) as solver:
        if not solver.solve():
            return None
        true = {x for x in solver.get_model() if x > 0}
    plan = []
    for i in range(k):
        pos, actions = tuple(board["starts"][i]), []
        for t in range(horizon):
            nxt = next(u for u in _neighbours(pos, n, holes) if var.get((i, u, t + 1)) in true)
            actions.append(MOVES[(nxt[0] - pos[0], nxt[1] - pos[1])])
            pos = nxt
        plan.append(actions)
    return plan


def _trim(plan):
    """Drop the trailing STAYs every agent shares (the plan's makespan is unchanged)."""
    plan = [list(p) for p in plan]
    for p in plan:
        while p and p[-1] == "STAY":
            p.pop()
    return plan


def solve(board: dict, upper_bound: int | None = None, max_makespan: int = 64) -> Solution:
    """The optimal makespan of one board (interchange dict), with a witness plan.

    Args:
      board: {"size", "holes", "starts", "goals"}.
      upper_bound: a known feasible makespan (from prioritized planning), if any.
      max_makespan: the horizon; a board with no plan within it is reported infeasible.
    """
    start = time.perf_counter()
    from_start = [bfs(board, s) for s in board["starts"]]
    to_goal = [bfs(board, g) for g in board["goals"]]
    dists = [d.get(tuple(g)) for d, g in zip(from_start, board["goals"])]
    solves = 0
    if any(d is None for d in dists):
        return Solution(None, None, None, time.perf_counter() - start, solves)
    lower = max(dists + [0])
    best_plan = None
    if upper_bound is None or upper_bound < 0:
        if joint_reachable(board, max_makespan) is False:
            return Solution(None, lower, None, time.perf_counter() - start, solves)
        solves += 1
        best_plan = _solve_at(board, max_makespan, from_start, to_goal)
        if best_plan is None:
            return Solution(None, lower, None, time.perf_counter() - start, solves)
        upper_bound = max(len(p) for p in _trim(best_plan))
    for t in range(lower, upper_bound):
        solves += 1
        plan = _solve_at(board, t, from_start, to_goal)
        if plan is not None:
            return Solution(t, lower, _trim(plan), time.perf_counter() - start, solves)
    if best_plan is None:  # the upper bound's own plan came from elsewhere: make a witness
        solves += 1
        best_plan = _solve_at(board, upper_bound, from_start, to_goal)
    return Solution(upper_bound, lower, _trim(best_plan), time.perf_counter() - start, solves)


def solve_job(job: tuple) -> Solution:
    """`solve(*job)` for (board, upper_bound, max_makespan): what pool workers run."""
    board, upper, max_makespan = job
    return solve(board, upper, max_makespan)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _worker_init(parent: int) -> None:
    """A solver worker leaves Ctrl-C to its parent and, on Linux, is killed when the parent dies
    (SIGKILL included), so no worker outlives the command that started it. A parent that died
    before this ran (while the worker was still importing) fires no signal: exit at once then."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _kill_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    if hasattr(pool, "kill_workers"):  # Python >= 3.14
        pool.kill_workers()
        return
    for process in list((pool._processes or {}).values()):  # no public way before 3.14
        process.kill()


@contextlib.contextmanager
def make_pool(workers: int | None = None) -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """`with make_pool(n) as pool`: solver processes (spawned, so no JAX state is forked) that die
    with this process. Leaving the block normally waits for the jobs; leaving it by an exception
    (Ctrl-C, SIGTERM turned into one, an error) cancels the queued jobs and kills the workers at
    once instead of waiting for the running solves."""
    workers = workers or max(1, multiprocessing.cpu_count())
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(os.getpid(),),
    )
    # Start every worker now, with SIGINT ignored: a process inherits that at its start (before
    # the initializer runs), so a Ctrl-C to the terminal's process group reaches the parent alone.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for _ in range(workers):
            pool.submit(int)  # each submit with no idle worker starts one
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        _kill_workers(pool)
        raise
    pool.shutdown()


def solve_many(
    jobs: Iterable[tuple[dict, int | None]],
    pool=None,
    max_makespan: int = 64,
    window: int = 64,
    on_done: Callable[[], None] | None = None,
) -> list[Solution]:
    """Solve (board, upper_bound) pairs, in a process pool when one is given, in input order.

    At most `window` jobs are queued in the pool at once, so leaving early (Ctrl-C) has at most
    that many to cancel; `on_done()` is called as each job finishes (a progress bar's update)."""
    jobs = [(b, u, max_makespan) for b, u in jobs]
    results: list[Solution | None] = [None] * len(jobs)
    if pool is None:
        for i, job in enumerate(jobs):
            results[i] = solve_job(job)
            on_done and on_done()
        return results
    todo = iter(enumerate(jobs))
    pending = {pool.submit(solve_job, job): i for i, job in itertools.islice(todo, window)}
    while pending:
        done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            results[pending.pop(future)] = future.result()
            on_done and on_done()
        pending.update({pool.submit(solve_job, job): i for i, job in itertools.islice(todo, len(done))})
    return results
