"""The jitted validator against the plain-Python reference simulator."""

import pytest
from conftest import make_board
from hypothesis import given
from hypothesis import strategies as st

from t2t_jax.env import io, reference
from t2t_jax.env.types import ACTION_NAMES, ParseStatus
from t2t_jax.env.validator import validate

S, A, T = 6, 5, 16
SCALARS = (
    "valid",
    "optimal",
    "makespan",
    "all_goals_reached",
    "has_illegal_moves",
    "out_of_bounds",
    "hole",
    "vertex_collision",
    "edge_collision",
    "missing_agent",
    "unknown_agent",
    "first_violation_step",
    "sum_of_costs",
)


def run(boards, plans, extra=None, statuses=None, max_agents=A, horizon=T):
    b = io.boards_from_json(boards, S, A)
    p = io.plans_from_lists(plans, max_agents, horizon, statuses=statuses, unknown=extra)
    v = validate(b, p)
    return [io.verdict_to_json(v, i) for i in range(len(boards))]


def check_against_reference(board, plan, extra=False):
    ours = run([board], [plan], extra=[extra])[0]
    ref = reference.simulate(board, plan, extra_agents=extra)
    for name in SCALARS:
        assert ours[name] == ref[name], (name, ours[name], ref[name], board, plan)
    assert ours["goal_reached"][: len(board["starts"])] == ref["goal_reached"]
    return ours


@st.composite
def boards(draw, max_agents=A):
    n = draw(st.integers(3, S))
    cells = [(r, c) for r in range(n) for c in range(n)]
    k = draw(st.integers(1, max_agents))
    starts = draw(st.lists(st.sampled_from(cells), min_size=k, max_size=k, unique=True))
    goals = draw(st.lists(st.sampled_from(cells), min_size=k, max_size=k, unique=True))
    rest = [c for c in cells if c not in starts and c not in goals]
    holes = draw(st.lists(st.sampled_from(rest), unique=True, max_size=len(rest) // 2)) if rest else []
    opt = draw(st.one_of(st.none(), st.integers(0, 12)))
    return make_board(n, holes, starts, goals, opt)


def toward(pos, target):
    """Greedy step names from pos to target (ignores holes)."""
    (r, c), (tr, tc) = pos, target
    return ["DOWN" if tr > r else "UP"] * abs(tr - r) + ["RIGHT" if tc > c else "LEFT"] * abs(tc - c)


@st.composite
def plans(draw, board):
    """Random and adversarial plans: random walks, goal-seeking (which collides, swaps and
    follows), reaching the goal and leaving, stopping short, missing agents."""
    out = []
    for s, g in zip(board["starts"], board["goals"]):
        kind = draw(st.sampled_from(["random", "greedy", "leave", "short", "missing", "empty"]))
        greedy = toward(s, g)
        if kind == "random":
            out.append(draw(st.lists(st.sampled_from(ACTION_NAMES), max_size=T)))
        elif kind == "greedy":
            out.append(draw(st.permutations(greedy)) if greedy else [])
        elif kind == "leave":
            out.append(greedy + [draw(st.sampled_from(ACTION_NAMES[1:]))])
        elif kind == "short":
            out.append(greedy[: draw(st.integers(0, max(len(greedy) - 1, 0)))])
        elif kind == "missing":
            out.append(None)
        else:
            out.append([])
    return out


@given(st.data())
def test_validator_agrees_with_reference(data):
    board = data.draw(boards())
    plan = data.draw(plans(board))
    extra = data.draw(st.booleans()) if data.draw(st.integers(0, 9)) == 0 else False
    check_against_reference(board, plan, extra)


@given(st.data())
def test_validator_batch_equals_single(data):
    items = [data.draw(boards()) for _ in range(3)]
    plan_list = [data.draw(plans(b)) for b in items]
    batched = run(items, plan_list)
    for b, p, v in zip(items, plan_list, batched):
        assert run([b], [p])[0] == v


# Hand-made cases, one per rule of the contract.
LINE = make_board(4, starts=[(0, 0), (0, 1)], goals=[(0, 1), (0, 2)], optimal_makespan=1)


def test_following_is_allowed():
    v = check_against_reference(LINE, [["RIGHT"], ["RIGHT"]])
    assert v["valid"] and v["optimal"] and v["makespan"] == 1


def test_swap_is_an_edge_collision():
    board = make_board(3, starts=[(0, 0), (0, 1)], goals=[(0, 1), (0, 0)])
    v = check_against_reference(board, [["RIGHT"], ["LEFT"]])
    assert v["edge_collision"] and not v["vertex_collision"] and not v["valid"]
    assert v["first_violation_step"] == 1


def test_rotation_of_four_is_allowed():
    board = make_board(
        3, starts=[(0, 0), (0, 1), (1, 1), (1, 0)], goals=[(0, 1), (1, 1), (1, 0), (0, 0)], optimal_makespan=1
    )
    v = check_against_reference(board, [["RIGHT"], ["DOWN"], ["LEFT"], ["UP"]])
    assert v["valid"] and v["optimal"] and not v["edge_collision"]


def test_shared_cell_is_a_vertex_collision():
    board = make_board(3, starts=[(0, 0), (0, 2)], goals=[(2, 0), (2, 2)])
    v = check_against_reference(board, [["RIGHT", "DOWN", "DOWN", "LEFT"], ["LEFT", "DOWN", "DOWN", "RIGHT"]])
    assert v["vertex_collision"] and v["first_violation_step"] == 1 and not v["valid"]


def test_hole_and_out_of_bounds():
    board = make_board(3, holes=[(1, 1)], starts=[(0, 1)], goals=[(2, 1)])
    v = check_against_reference(board, [["DOWN", "DOWN"]])
    assert v["hole"] and not v["all_goals_reached"] and v["first_violation_step"] == 1
    v = check_against_reference(board, [["UP", "RIGHT", "DOWN", "DOWN", "LEFT"]])
    assert v["out_of_bounds"] and v["first_violation_step"] == 1 and not v["valid"]
    v = check_against_reference(board, [["RIGHT", "DOWN", "DOWN", "LEFT"]])
    assert v["valid"] and v["makespan"] == 4 and not v["optimal"]  # optimum unknown


def test_reach_goal_and_leave_and_stop_short():
    v = check_against_reference(make_board(4, starts=[(0, 0)], goals=[(0, 1)]), [["RIGHT", "RIGHT"]])
    assert not v["valid"] and not v["all_goals_reached"] and not v["has_illegal_moves"]
    v = check_against_reference(LINE, [["RIGHT", "RIGHT"], ["RIGHT"]])  # leaves onto agent 1
    assert v["vertex_collision"] and v["first_violation_step"] == 2
    v = check_against_reference(LINE, [["RIGHT"], []])
    assert v["vertex_collision"] and not v["valid"]
    v = check_against_reference(make_board(4, starts=[(0, 0)], goals=[(0, 3)]), [["RIGHT"]])
    assert not v["all_goals_reached"] and v["makespan"] == -1


def test_leaving_and_coming_back_sets_the_makespan():
    board = make_board(3, starts=[(0, 0)], goals=[(0, 1)], optimal_makespan=1)
    v = check_against_reference(board, [["RIGHT", "RIGHT", "LEFT"]])
    assert v["valid"] and v["makespan"] == 3 and not v["optimal"]


def test_missing_and_extra_agents():
    v = check_against_reference(LINE, [["RIGHT"], None])
    assert v["missing_agent"] and not v["valid"]
    v = check_against_reference(LINE, [["RIGHT"], ["RIGHT"]], extra=True)
    assert v["unknown_agent"] and not v["valid"]
    # A plan line for a padded slot of a 2-agent board is an unknown agent too.
    v = run([LINE], [[["RIGHT"], ["RIGHT"], ["UP"]]])[0]
    assert v["unknown_agent"] and not v["valid"]


def test_parse_statuses_invalidate():
    for status, flag in [(ParseStatus.BAD_ACTION, "parse_error"), (ParseStatus.TRUNCATED, "truncated")]:
        v = run([LINE], [[["RIGHT"], ["RIGHT"]]], statuses=[int(status)])[0]
        assert v[flag] and not v["valid"]


def test_plans_with_fewer_slots_than_the_board():
    v = run([LINE], [[["RIGHT"]]], max_agents=1)[0]
    assert v["missing_agent"] and not v["valid"]


def test_zero_length_plan_on_a_solved_board():
    board = make_board(3, starts=[(1, 1)], goals=[(1, 1)], optimal_makespan=0)
    v = check_against_reference(board, [[]])
    assert v["valid"] and v["optimal"] and v["makespan"] == 0


@pytest.mark.parametrize("horizon", [1, 8, 40])
def test_any_horizon(horizon):
    v = run([LINE], [[["RIGHT"], ["RIGHT"]]], horizon=horizon)[0]
    assert v["valid"]
