"""Interchange formats: board JSON, plan text, parse statuses."""

import json

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


# -- issue 31: every number bounded on read, JSON parsed with bounded depth --------------------------

BOARD = {"size": 3, "holes": [[1, 1]], "starts": [[0, 0]], "goals": [[2, 2]]}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bucket": 2**40}, "board 0: bucket: 1099511627776 is outside the legal range [0, 2147483647]"),
        ({"bucket": -1}, "board 0: bucket: -1 is outside the legal range [0, 2147483647]"),
        ({"optimal_makespan": 2**63}, "board 0: optimal_makespan: 9223372036854775808 is outside the legal range"),
        ({"lower_bound": 2**64}, "board 0: lower_bound: 18446744073709551616 is outside the legal range"),
        ({"plan": ["Agent 0: UP"]}, "board 0: plan: ['Agent 0: UP'] is not a string"),
    ],
)
def test_numbers_past_int32_are_refused_naming_the_field_and_range(change, message):
    with pytest.raises(ValueError) as e:
        io.boards_from_json([{**BOARD, **change}])
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"size": ' + "[" * 100_000 + "]" * 100_000 + "}", "f:1: JSON nested deeper than 32 levels"),
        ('{"text": ' + "{" * 5000 + "}" * 5000 + "}", "f:1: JSON nested deeper than 32 levels"),
        ('{"size": NaN}', "f:1: NaN is not JSON"),
        ('{"size": -Infinity}', "f:1: -Infinity is not JSON"),
        ('{"size": 4', "f:1: not JSON"),
    ],
)
def test_json_is_parsed_with_bounded_depth_and_finite_numbers(line, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        io.loads_bounded(line, "f:1")


def test_brackets_inside_strings_are_not_nesting():
    text = '{"text": "' + "[" * 1000 + '", "x": [[1]]}'
    assert io.loads_bounded(text, "f:1") == {"text": "[" * 1000, "x": [[1]]}


def test_integers_of_thousands_of_digits_are_never_converted():
    item = io.loads_bounded('{"size": ' + "9" * 6000 + "}", "f:1")
    assert isinstance(item["size"], io.BigNumber) and "(6000 digits)" in repr(item["size"])
    with pytest.raises(ValueError, match=r"board 0: size: 9{12}\.\.\.\(6000 digits\) is outside the legal"):
        io.boards_from_json([{**BOARD, "size": item["size"]}])


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "holds no boards"),
        (b"\n  \n", "holds no boards"),
        (b"\x89PNG\r\n\x1a\n\xff\xfe\n", ":1: not UTF-8 text"),
        (b'{"size": 3, "pad": "' + b"x" * (17 << 20) + b'"}\n', ":1: a line longer than 16777216 bytes"),
        (json.dumps(BOARD).encode() + b"\n" + b'{"size": ' + b"[" * 50_000 + b"\n", ":2: JSON nested deeper"),
        (json.dumps({**BOARD, "optimal_makespan": 2**64}).encode() + b"\n", ":1: optimal_makespan: 1844674407"),
    ],
)
def test_board_files_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "boards.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError) as e:
        io.read_boards(str(path))
    assert str(e.value).startswith(str(path)) and message in str(e.value), str(e.value)


def test_plan_files_are_read_with_the_same_bounds(tmp_path):
    path = tmp_path / "plans.jsonl"
    path.write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ValueError, match="plans.jsonl:1: JSON nested deeper than 32 levels"):
        io.read_plans(str(path))
