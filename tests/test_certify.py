"""Certified optima: device bounds, the exact solver, brute force, and the eval sets."""

import itertools
import json
import subprocess
import sys
from collections import deque

import jax
import numpy as np
import pytest
from conftest import generator, make_board

from t2t_jax.env import io, solver
from t2t_jax.env.certified import CertifiedGenerator, merge_replaced
from t2t_jax.env.certify import certify_jit
from t2t_jax.env.config import make_config
from t2t_jax.env.validator import validate
from t2t_jax.evaluation import sets
from t2t_jax.text.parsing import parse_completion, parse_completions

MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))


def brute_force(board, limit=64):
    """Joint-state BFS: the optimal makespan, or None if no joint plan exists at all."""
    n, holes = board["size"], {tuple(h) for h in board["holes"]}
    start, goal = tuple(map(tuple, board["starts"])), tuple(map(tuple, board["goals"]))
    seen, queue = {start: 0}, deque([start])
    while queue:
        state = queue.popleft()
        if state == goal:
            return seen[state]
        options = []
        for r, c in state:
            options.append(
                [
                    (r + dr, c + dc)
                    for dr, dc in MOVES
                    if 0 <= r + dr < n and 0 <= c + dc < n and (r + dr, c + dc) not in holes
                ]
            )
        for nxt in itertools.product(*options):
            if len(set(nxt)) < len(nxt) or nxt in seen:
                continue
            if any(
                nxt[i] == state[j] and nxt[j] == state[i] and state[i] != state[j]
                for i in range(len(nxt))
                for j in range(i + 1, len(nxt))
            ):
                continue
            seen[nxt] = seen[state] + 1
            queue.append(nxt)
    return None


SMALL = make_config(
    [
        {"size": [3, 4], "agents": [2, 3], "hole_density": [0.0, 0.5]},
        {"size": 5, "agents": 2, "hole_density": [0.0, 0.5]},
    ]
)


def test_solver_and_device_bounds_agree_with_brute_force():
    boards = generator(SMALL)(jax.random.key(0), 160)
    bounds = jax.device_get(certify_jit(boards))
    items = io.boards_to_json(boards)
    infeasible = 0
    for i, item in enumerate(items):
        truth = brute_force(item)
        sol = solver.solve(item, int(bounds.upper[i]))
        assert sol.optimal_makespan == truth, (item, sol, truth)
        if truth is None:
            infeasible += 1
            assert int(bounds.upper[i]) == -1
            continue
        assert int(bounds.lower[i]) <= truth
        if int(bounds.upper[i]) >= 0:
            assert truth <= int(bounds.upper[i])
        if bool(bounds.certified[i]):
            assert truth == int(bounds.upper[i])
    assert infeasible > 0  # small dense boards include jointly infeasible ones


def test_joint_reachability_agrees_with_brute_force():
    boards = generator(SMALL)(jax.random.key(3), 120)
    answers = set()
    for item in io.boards_to_json(boards):
        truth = brute_force(item)
        answers.add(truth is None)
        assert solver.joint_reachable(item, 64) == (truth is not None), item
    assert answers == {True, False}
    big = make_board(10, holes=[], starts=[(0, i) for i in range(5)], goals=[(9, i) for i in range(5)])
    assert solver.joint_reachable(big, 64) is None  # (100 * 5)^5 joint work: not attempted


def test_known_infeasible_board():
    # A 1-wide corridor where two agents must swap: each can reach its goal alone, no joint plan.
    board = make_board(
        3, holes=[(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)], starts=[(0, 0), (0, 2)], goals=[(0, 2), (0, 0)]
    )
    assert brute_force(board) is None
    assert solver.solve(board).optimal_makespan is None


def test_certified_generator_every_board_certified():
    config = make_config(
        [
            {"size": [3, 5], "agents": [2, 3], "hole_density": [0.0, 0.5]},
            {"size": [6, 10], "agents": [2, 5], "hole_density": [0.0, 0.5]},
        ]
    )
    gen = CertifiedGenerator(config, chunk=256)
    boards, plans = gen(jax.random.key(1), 300)
    stats = gen.last_stats
    assert boards.size.shape == (300,) and stats.infeasible > 0 and stats.solved_on_host > 0
    # Per bucket, over the chunks used (here both: 256 boards less the infeasible are not 300).
    assert set(stats.replaced) <= {"0", "1"} and sum(c["generated"] for c in stats.replaced.values()) == 512
    assert sum(c["replaced"] for c in stats.replaced.values()) == stats.infeasible
    assert merge_replaced(stats.replaced, stats.replaced) == {
        b: {"generated": 2 * c["generated"], "replaced": 2 * c["replaced"]} for b, c in stats.replaced.items()
    }
    opt, lb = np.asarray(boards.optimal_makespan), np.asarray(boards.lower_bound)
    assert (opt >= lb).all() and (lb >= 0).all()
    v = validate(boards, plans)
    assert np.asarray(v.valid).all() and np.asarray(v.optimal).all()
    np.testing.assert_array_equal(np.asarray(v.makespan), opt)


def test_certified_generator_stops_when_check_raises_and_cancels_queued_jobs():
    """`check` runs before each chunk; when it raises, the call stops there and the solver jobs
    still queued are cancelled (only those already handed to the worker run on). Jobs the worker
    finished before the raise are neither, so they are set aside (a loaded CI machine finishes some)."""
    config = make_config([{"size": [6, 10], "agents": [3, 5], "hole_density": [0.3, 0.5]}])
    calls, futures, finished = [], [], set()

    def check():
        calls.append(1)
        if len(calls) == 2:
            finished.update(id(f) for f in futures if f.done())
            raise KeyboardInterrupt

    with solver.make_pool(1) as pool:
        submit = pool.submit
        pool.submit = lambda *a: futures.append(submit(*a)) or futures[-1]
        gen = CertifiedGenerator(config, chunk=256, pool=pool)
        with pytest.raises(KeyboardInterrupt):
            gen(jax.random.key(3), 300, check=check)
        queued = [f for f in futures if id(f) not in finished]
        assert len(calls) == 2 and len(queued) > 4
        # the running job, the worker's next, and one more if the running job ends during the raise
        assert sum(not f.cancelled() for f in queued) <= 3


def test_solve_cli(tmp_path):
    path = tmp_path / "boards.jsonl"
    board = make_board(3, holes=[(1, 1)], starts=[(0, 0), (2, 2)], goals=[(2, 2), (0, 0)])
    path.write_text(json.dumps(board) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "launch.mapf", "solve", f"--boards={path}", "--workers=1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[0])
    assert result["optimal_makespan"] == brute_force(board) == 4 and result["lower_bound"] == 4
    plan, status = parse_completion(result["plan"], 2, 64)
    v = validate(io.boards_from_json([board | {"optimal_makespan": 4}]), io.plans_from_lists([plan], 5, 8))
    assert bool(v.optimal[0])


@pytest.mark.parametrize("name", sets.BENCHMARK + ("ood_6_agents", "ood_dense"))
def test_shipped_sets(name):
    spec = sets.SETS[name]
    items = sets.load(name)
    assert len(items) == spec.boards * len(spec.sizes)
    for _, cell in itertools.groupby(items, key=lambda b: b["size"]):
        assert len(list(cell)) == spec.boards
    assert sorted({b["size"] for b in items}) == list(spec.sizes)
    assert all(len(b["starts"]) == spec.agents for b in items)
    boards = sets.load_boards(name)
    plans = parse_completions([b["plan"] for b in items], [spec.agents] * len(items), spec.max_agents, sets.HORIZON)
    v = validate(boards, plans)
    assert np.asarray(v.valid).all() and np.asarray(v.optimal).all()


def test_regeneration_is_byte_for_byte_one_cell_per_set():
    for name, n in [("mapf_3_agents", 3), ("mapf_4_agents", 7), ("mapf_5_agents", 10)]:
        spec = sets.SETS[name]
        shipped = open(sets.path(name)).read().splitlines()
        start = spec.sizes.index(n) * spec.boards
        rebuilt = [json.dumps(b, sort_keys=True) for b in sets.build(name, sizes=(n,))]
        assert rebuilt == shipped[start : start + spec.boards], name


@pytest.mark.slow
@pytest.mark.long  # (all five sets certified again; the default run rebuilds one cell of each benchmark set)
@pytest.mark.parametrize("name", list(sets.SETS))
def test_regeneration_is_byte_for_byte(name, tmp_path):
    rebuilt = "".join(json.dumps(b, sort_keys=True) + "\n" for b in sets.build(name))
    assert rebuilt == open(sets.path(name)).read()


def test_solve_many_keeps_order_and_bounds_the_queue():
    """In a pool: the serial answers in input order, `on_done` once per job, and never more than
    `window` jobs queued at once (so a Ctrl-C has at most that many to cancel)."""
    config = make_config([{"size": [3, 6], "agents": [2, 3], "hole_density": [0.0, 0.3]}])
    batch, _ = generator(config).sample(jax.random.key(5), 24)
    jobs = [(b, None) for b in io.boards_to_json(batch)]
    serial = solver.solve_many(jobs)
    done, queued, most = [], set(), [0]
    with solver.make_pool(2) as pool:
        submit = pool.submit

        def counted(*args):
            future = submit(*args)
            queued.add(future)
            future.add_done_callback(queued.discard)
            most[0] = max(most[0], len(queued))
            return future

        pool.submit = counted
        pooled = solver.solve_many(jobs, pool, window=4, on_done=lambda: done.append(1))
    assert [s.optimal_makespan for s in pooled] == [s.optimal_makespan for s in serial]
    assert all(s.optimal_makespan is not None for s in serial)
    assert len(done) == len(jobs) and 1 <= most[0] <= 4
