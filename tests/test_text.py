"""The language interface: prompts, parsing (fuzzed), rewards, the embedded tokenizer."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_board
from hypothesis import given, settings
from hypothesis import strategies as st

from t2t_jax.env import io
from t2t_jax.env.types import ACTION_NAMES, ParseStatus
from t2t_jax.env.validator import validate
from t2t_jax.evaluation import sets
from t2t_jax.rl import rewards
from t2t_jax.text import prompts
from t2t_jax.text.parsing import parse_completion, parse_completions
from t2t_jax.text.tokenizer import IM_END, PAD, load_tokenizer, stop_ids


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_prompt_states_board_rules_and_format():
    board = make_board(4, holes=[(1, 1)], starts=[(0, 0), (3, 3)], goals=[(3, 3), (0, 0)])
    text = prompts.board_prompt(board)
    assert "....\n.H..\n....\n...." in text
    assert "Agent 1: start (3, 3), goal (0, 0)" in text
    assert "swap" in text and "same cell" in text and "hole" in text
    assert text.endswith("Agent 0: ACTION ACTION ...\nAgent 1: ACTION ACTION ...")


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_and_padding(tok, thinking):
    board = make_board(3, starts=[(0, 0)], goals=[(2, 2)])
    text = prompts.render_chat(tok, board, enable_thinking=thinking)
    assert text.startswith("<|im_start|>system\n") and "<|im_start|>assistant\n" in text
    assert text.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))
    long_board = make_board(10, starts=[(0, i) for i in range(5)], goals=[(9, i) for i in range(5)])
    ids, mask = prompts.encode_prompts(tok, [board, long_board], enable_thinking=thinking)
    assert ids.shape[1] in prompts.LENGTH_BUCKETS and ids.dtype == np.int32
    assert mask[:, -1].all() and not mask[0, 0]  # left-padded
    assert (ids[~mask] == tok.pad_token_id).all()
    assert tok.decode(ids[0][mask[0]]) == text


def test_special_ids(tok):
    vocab = tok.get_vocab()
    assert tok.pad_token == PAD and tok.pad_token_id != vocab[IM_END]
    assert set(stop_ids(tok)) == {vocab[IM_END], vocab[PAD]}
    assert len(tok) <= 1100


def test_tokenizer_covers_prompts_answers_and_configs(tok):
    """No unknown tokens and exact round trips on 10,000 generated prompts and answers."""
    from t2t_jax.text.tokenizer import training_corpus

    unk = tok.unk_token_id
    count = 0
    for text in training_corpus(2500, seed=123):  # 4 texts per board: system, user, answer, config
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert unk is None or unk not in ids
        assert tok.decode(ids) == text
        count += 1
    assert count == 10000
    weird = "Agent 0: ↑ → ✓ ünïcödé 🧊 \t\x00"
    assert tok.decode(tok(weird, add_special_tokens=False)["input_ids"]) == weird


def test_prompt_round_trip_with_solver_plans(tok):
    """Board -> prompt -> the witness plan written as the answer -> parse -> valid and optimal."""
    items = sets.load("mapf_4_agents")[::50]
    texts = []
    for board in items:
        prompt = prompts.render_chat(tok, board, enable_thinking=True)
        completion = f"<think>\nI plan it.\n</think>\n\n{board['plan']}"
        decoded = tok.decode(tok(prompt + completion, add_special_tokens=False)["input_ids"])
        texts.append(decoded[len(prompt) :])
    plans = parse_completions(texts, [4] * len(items), 5, 64)
    v = validate(io.boards_from_json(items), plans)
    assert np.asarray(v.valid).all() and np.asarray(v.optimal).all()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Agent 0: LEFT DOWN\nAgent 1: UP", [["LEFT", "DOWN"], ["UP"]]),
        ("Sure! Here is the plan:\n- **Agent 0**: left, down.\n- Agent 1 : up", [["LEFT", "DOWN"], ["UP"]]),
        ("1. agent 0: LEFT -> DOWN\n2. Agent 1: UP → STAY (waits)", [["LEFT", "DOWN"], ["UP", "STAY"]]),
        ("`Agent 0: LEFT; DOWN`\nAgent 1: wait", [["LEFT", "DOWN"], ["STAY"]]),
        ("Agent 0: UP\nAgent 1: UP\nFinal answer:\nAgent 0: LEFT DOWN\nAgent 1: UP", [["LEFT", "DOWN"], ["UP"]]),
        ("<think>Agent 0: RIGHT\nAgent 1: RIGHT</think>\nAgent 0: LEFT DOWN\nAgent 1: UP", [["LEFT", "DOWN"], ["UP"]]),
        ("Agent 0:\nAgent 1: UP", [[], ["UP"]]),
    ],
)
def test_tolerant_parsing(text, expected):
    plan, status = parse_completion(text, 2, 16)
    assert status == ParseStatus.OK and plan == expected


@pytest.mark.parametrize(
    "text, status",
    [
        ("", ParseStatus.NO_ANSWER),
        ("I cannot solve this.", ParseStatus.NO_ANSWER),
        ("<think>Agent 0: UP\nAgent 1: UP", ParseStatus.NO_ANSWER),  # think block never closed
        ("Agent 0: JUMP\nAgent 1: UP", ParseStatus.BAD_ACTION),
        ("Agent 0: UP twice\nAgent 1: UP", ParseStatus.BAD_ACTION),
        ("Agent 0: UP\nAgent 1: UP\nAgent 2: UP", ParseStatus.UNKNOWN_AGENT),
        ("Agent 0: UP\nAgent 1: " + "UP " * 17, ParseStatus.TOO_LONG),
        ("Agent 0: UP", ParseStatus.MISSING_AGENT),
    ],
)
def test_strict_parsing(text, status):
    assert parse_completion(text, 2, 16)[1] == status


def test_truncated_and_statuses_reach_the_verdict():
    board = make_board(3, starts=[(0, 0)], goals=[(0, 1)], optimal_makespan=1)
    plans = parse_completions(
        ["Agent 0: RIGHT", "Agent 0: RIGHT", "Agent 0: FLY", "Agent 0: RIGHT\nAgent 3: UP"],
        [1] * 4,
        5,
        8,
        truncated=[False, True, False, False],
    )
    v = validate(io.boards_from_json([board] * 4), plans)
    assert np.asarray(v.valid).tolist() == [True, False, False, False]
    assert bool(v.truncated[1]) and bool(v.parse_error[2]) and bool(v.unknown_agent[3])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.integers(1, 6))
def test_parser_never_raises(text, k):
    plan, status = parse_completion(text, k, 32)
    assert len(plan) == k and isinstance(status, ParseStatus)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(ACTION_NAMES + ("Agent 0:", "Agent 1 :", "\n", "->", ",", "</think>", "**")),
            st.text(max_size=8),
        ),
        max_size=60,
    )
)
def test_parser_never_raises_on_near_miss_text(parts):
    parse_completion(" ".join(parts), 3, 16)


def test_parser_is_fast_on_megabyte_inputs():
    texts = [
        "Agent 0: " + "LEFT " * 200_000,
        "x" * 1_000_000,
        ("Agent 1: UP\n" * 80_000),
        "(" * 500_000 + "Agent 0: UP",
        "agent 0" + "*" * 500_000 + ":",
        " " * 1_000_000 + "agent",
    ]
    for text in texts:
        start = time.perf_counter()
        plan, status = parse_completion(text, 2, 64)
        assert time.perf_counter() - start < 2.0
        assert isinstance(status, ParseStatus)


def verdicts_for(plans_text, board):
    plans = parse_completions(plans_text, [len(board["starts"])] * len(plans_text), 5, 16)
    boards = io.boards_from_json([board] * len(plans_text))
    return validate(boards, plans), plans.parse_status, boards


def test_reward_terms():
    board = make_board(3, starts=[(0, 0), (2, 2)], goals=[(0, 2), (2, 0)], optimal_makespan=2)
    texts = [
        "Agent 0: RIGHT RIGHT\nAgent 1: LEFT LEFT",  # optimal
        "Agent 0: DOWN RIGHT RIGHT UP\nAgent 1: LEFT LEFT",  # valid, makespan 4
        "Agent 0: RIGHT RIGHT\nAgent 1: LEFT",  # one agent short
        "Agent 0: UP\nAgent 1: LEFT LEFT",  # leaves the grid
        "no idea",
    ]
    v, status, boards = verdicts_for(texts, board)
    terms = rewards.reward_terms(
        v, status, boards.optimal_makespan, boards.num_agents, jnp.array([10, 20, 10, 10, 40]), 40
    )
    np.testing.assert_allclose(terms["format"], [1, 1, 1, 1, 0])
    np.testing.assert_allclose(terms["valid"], [1, 1, 0, 0, 0])
    np.testing.assert_allclose(terms["optimal"], [1, 0, 0, 0, 0])
    np.testing.assert_allclose(terms["progress"], [1, 1, 0.5, 0, 0])
    np.testing.assert_allclose(terms["efficiency"], [1, 0.5, 0, 0, 0])
    np.testing.assert_allclose(terms["length"], [-0.25, -0.5, -0.25, -0.25, -1])
    total = jax.jit(rewards.total_reward)(terms, {"valid": 1.0, "optimal": 0.5, "length": 0.1})
    np.testing.assert_allclose(total, [1.475, 0.95, -0.025, -0.025, -0.1], rtol=1e-6)
    with pytest.raises(ValueError, match="unknown terms"):
        rewards.total_reward(terms, {"speed": 1.0})


def test_prompt_styles():
    from t2t_jax.text.prompts import PROMPT_STYLES, board_prompt, chat_messages

    board = {"size": 3, "holes": [[1, 1]], "starts": [[2, 0], [0, 0]], "goals": [[0, 2], [0, 1]]}
    full, compact, offsets = (board_prompt(board, s) for s in PROMPT_STYLES)
    assert "Rules:" in full and "Rules:" not in compact and compact in offsets
    assert "Agent 0 goal: 2 UP 2 RIGHT" in offsets and "Agent 1 goal: 0 UP 1 RIGHT" in offsets
    assert [m["role"] for m in chat_messages(board, "compact")] == ["user"]
    assert [m["role"] for m in chat_messages(board, "full")] == ["system", "user"]
    with pytest.raises(ValueError, match="prompt style: 'long'"):
        board_prompt(board, "long")
