"""Plain-Python reference implementations, one board at a time.

Independent of the jitted code on purpose: the tests check the batched validator and generator
against these, and `launch/bench_env.py` times them as the per-board baseline. Boards and plans
are the interchange dicts of `io.py`: {"size", "holes", "starts", "goals"} and a list of
per-agent action-name lists (None for an agent without a line).
"""

from __future__ import annotations

import collections
import random

MOVES = {"STAY": (0, 0), "UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}


def trajectory(board: dict, plan: list) -> dict:
    """Execute `plan` on `board` under the rules of validator.py, step by step.

    plan: one entry per agent of the board (index = agent id): a list of action names, or None
    when the plan has no line for that agent.

    Returns {"positions": [T + 1][K] (row, col), "events": [(t, kind, [cells], [agents])], "flags",
    "first_violation_step", "arrival"}; kind is one of the four violation flags, t the time the
    move arrived at, agents the one that moved (out_of_bounds, hole) or the pair (collisions).
    """
    n = board["size"]
    holes = {tuple(h) for h in board["holes"]}
    goals = [tuple(g) for g in board["goals"]]
    pos = [tuple(s) for s in board["starts"]]
    k = len(pos)
    lines = [p or [] for p in list(plan) + [None] * (k - len(plan))]
    horizon = max([len(p) for p in lines] + [0])
    fallen = [False] * k
    flags = dict(out_of_bounds=False, hole=False, vertex_collision=False, edge_collision=False)
    events, positions = [], [list(pos)]
    arrival = [0 if pos[i] == goals[i] else 1 for i in range(k)]
    for t in range(horizon):
        old = list(pos)
        for i in range(k):
            if fallen[i]:
                continue
            act = lines[i][t] if t < len(lines[i]) else "STAY"
            dr, dc = MOVES[act]
            r, c = old[i][0] + dr, old[i][1] + dc
            if not (0 <= r < n and 0 <= c < n):
                events.append((t + 1, "out_of_bounds", [old[i]], [i]))
                continue
            pos[i] = (r, c)
            if (r, c) in holes:
                fallen[i] = True
                events.append((t + 1, "hole", [(r, c)], [i]))
        for i in range(k):
            for j in range(i + 1, k):
                if pos[i] == pos[j]:
                    events.append((t + 1, "vertex_collision", [pos[i]], [i, j]))
                if pos[i] == old[j] and pos[j] == old[i] and old[i] != old[j]:
                    events.append((t + 1, "edge_collision", [old[i], old[j]], [i, j]))
        for i in range(k):
            if pos[i] != goals[i]:
                arrival[i] = t + 2
        positions.append(list(pos))
    for _, kind, _, _ in events:
        flags[kind] = True
    return {
        "positions": positions,
        "events": events,
        "flags": flags,
        "arrival": arrival,
        "first_violation_step": min([t for t, _, _, _ in events], default=-1),
    }


def simulate(board: dict, plan: list, extra_agents: bool = False) -> dict:
    """The verdict dict of `plan` on `board` (see `trajectory`); extra_agents: the plan also
    named agents the board does not have."""
    run = trajectory(board, plan)
    goals = [tuple(g) for g in board["goals"]]
    final = run["positions"][-1]
    k = len(goals)
    missing = len(plan) < k or any(p is None for p in plan[:k])
    goal_reached = [final[i] == goals[i] for i in range(k)]
    all_goals = all(goal_reached)
    illegal = any(run["flags"].values())
    valid = not illegal and all_goals and not missing and not extra_agents
    opt = board.get("optimal_makespan", -1)
    makespan = max(run["arrival"] + [0]) if all_goals else -1
    return dict(
        valid=valid,
        optimal=valid and opt is not None and opt >= 0 and makespan == opt,
        makespan=makespan,
        all_goals_reached=all_goals,
        has_illegal_moves=illegal,
        missing_agent=missing,
        unknown_agent=extra_agents,
        goal_reached=goal_reached,
        first_violation_step=run["first_violation_step"],
        sum_of_costs=sum(run["arrival"]) if all_goals else -1,
        **run["flags"],
    )


def bfs(board: dict, source) -> dict:
    """{cell: distance} for every frozen cell reachable from `source`."""
    n = board["size"]
    holes = {tuple(h) for h in board["holes"]}
    source = tuple(source)
    if source in holes:
        return {}
    dist = {source: 0}
    queue = collections.deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in holes and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def generate(
    rng: random.Random, size: int, agents: int, density: float, min_distance: int = 1, tries: int = 1000
) -> dict:
    """A straightforward per-board generator with the candidate law of generator.py: a uniform
    layout with exactly round(density * size^2) holes, goals among frozen cells with a frozen
    neighbour, starts in the goal's component at distance >= min_distance; retried on failure."""
    cells = [(r, c) for r in range(size) for c in range(size)]
    n_holes = int(density * size * size + 0.5)
    for _ in range(tries):
        holes = set(rng.sample(cells, n_holes))
        free = [x for x in cells if x not in holes]
        board = {"size": size, "holes": sorted(holes), "starts": [], "goals": []}

        def frozen_neighbour(x):
            return any((x[0] + dr, x[1] + dc) in free_set for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)))

        free_set = set(free)
        goal_ok = [x for x in free if min_distance < 1 or frozen_neighbour(x)]
        if len(goal_ok) < agents:
            continue
        goals = rng.sample(goal_ok, agents)
        starts, ok = [], True
        for g in goals:
            dist = bfs(board, g)
            eligible = [x for x, d in dist.items() if d >= min_distance and x not in starts]
            if not eligible:
                ok = False
                break
            starts.append(rng.choice(eligible))
        if ok:
            board["starts"], board["goals"] = [list(s) for s in starts], [list(g) for g in goals]
            board["holes"] = [list(h) for h in board["holes"]]
            return board
    raise RuntimeError("no board found")
