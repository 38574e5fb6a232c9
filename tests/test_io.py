"""Interchange formats: board JSON, plan text, parse statuses."""

import jax
import numpy as np
import pytest
from conftest import generator, make_board

from t2t_jax.env import io
from t2t_jax.env.config import make_config
from t2t_jax.env.types import ParseStatus

CONFIG = make_config([{"size": [3, 10], "agents": [1, 2], "hole_density": [0.0, 0.5]}])


def test_board_json_round_trip():
    boards = generator(CONFIG)(jax.random.key(0), 32)
    items = io.boards_to_json(boards)
    again = io.boards_from_json(items)
    for name in ("size", "holes", "starts", "goals", "agent_mask", "bucket", "lower_bound"):
        np.testing.assert_array_equal(getattr(again, name), getattr(boards, name))


def test_board_text():
    board = make_board(3, holes=[(1, 1)], starts=[(0, 0)], goals=[(2, 2)])
    assert io.board_text(board) == "...\n.H.\n...\nAgent 0: start (0, 0), goal (2, 2)"


@pytest.mark.parametrize(
    "item, message",
    [
        ({"size": 11, "starts": [[0, 0]], "goals": [[1, 1]]}, "board 0: size: 11 is outside"),
        ({"size": 3, "starts": [[0, 3]], "goals": [[1, 1]]}, "board 0: starts[0]: [0, 3] is outside the 3x3 grid"),
        ({"size": 3, "starts": [[0, 0]], "goals": [[1, 1], [2, 2]]}, "1 starts and 2 goals"),
        ({"size": 3, "starts": [[0, 0], [0, 0]], "goals": [[1, 1], [2, 2]]}, "distinct"),
        ({"size": 3, "holes": [[0, 0]], "starts": [[0, 0]], "goals": [[1, 1]]}, "on a hole"),
    ],
)
def test_bad_boards_are_named(item, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        io.boards_from_json([item])


def test_plan_text():
    assert io.plan_to_text([[3, 2, 3], ["UP", "LEFT"], []]) == "Agent 0: LEFT DOWN LEFT\nAgent 1: UP LEFT\nAgent 2:"


def test_too_long_plans_are_cut_and_flagged():
    plans = io.plans_from_lists([[["UP"] * 10]], max_agents=2, horizon=4)
    assert int(plans.parse_status[0]) == ParseStatus.TOO_LONG
    assert plans.actions.shape == (1, 2, 4) and int(plans.lengths[0, 0]) == 10


def test_write_jsonl_is_atomic(tmp_path):
    path = tmp_path / "out.jsonl"
    io.write_jsonl(str(path), [{"a": 1}])

    def broken():
        yield {"a": 2}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        io.write_jsonl(str(path), broken())
    assert io.read_jsonl(str(path)) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
