"""SFT targets and batches: canonical plans stay certified optima; answers are masked right."""

import jax
import numpy as np
import pytest
from flax import nnx

from t2t_jax.env import io
from t2t_jax.env.certified import CertifiedGenerator
from t2t_jax.env.config import make_config
from t2t_jax.env.validator import validate
from t2t_jax.models import qwen3
from t2t_jax.rl import sft
from t2t_jax.rollout import Policy
from t2t_jax.sampling import Sampler
from t2t_jax.text.parsing import parse_completions
from t2t_jax.text.tokenizer import IM_END, load_tokenizer, stop_ids


def test_canonical_targets_are_optimal_and_straight_where_possible():
    config = make_config([{"size": [3, 6], "agents": [2, 3], "hole_density": [0.0, 0.4]}])
    boards = io.boards_with_plans_to_json(*CertifiedGenerator(config, chunk=128)(jax.random.key(0), 100))
    canon = sft.canonical_plans(boards)
    changed = sum(a["plan"] != b["plan"] for a, b in zip(boards, canon))
    straight = sum(c["plan"] == io.plan_to_text(sft.straight_plan(c)) for c in canon)
    assert 0 < changed <= straight < len(boards)  # some boards need detours or waits
    batch = io.boards_from_json(canon)
    plans = parse_completions([c["plan"] for c in canon], [len(c["starts"]) for c in canon], 5, 64)
    v = validate(batch, plans)
    assert np.asarray(v.valid).all() and np.asarray(v.optimal).all()


def test_straight_targets_keep_only_boards_whose_straight_plan_is_valid():
    config = make_config([{"size": [3, 6], "agents": [2, 3], "hole_density": [0.0, 0.4]}])
    boards = io.boards_with_plans_to_json(*CertifiedGenerator(config, chunk=128)(jax.random.key(1), 100))
    pool = sft.sft_targets(boards, "straight")
    canon = sft.canonical_plans(boards)
    assert 0 < len(pool) < len(boards)
    assert len(pool) == sum(c["plan"] == io.plan_to_text(sft.straight_plan(c)) for c in canon)
    assert all(b["plan"] == io.plan_to_text(sft.straight_plan(b)) for b in pool)
    plans = parse_completions([b["plan"] for b in pool], [len(b["starts"]) for b in pool], 5, 64)
    assert np.asarray(validate(io.boards_from_json(pool), plans).optimal).all()
    assert sft.sft_targets(boards, "witness") == boards
    with pytest.raises(ValueError, match="sft.targets: 'teacher' is not one of"):
        sft.sft_targets(boards, "teacher")


def test_sft_batch_masks_the_answer_and_its_end_token():
    tok = load_tokenizer()
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
    policy = Policy(Sampler(model, stop_ids(tok), tok.pad_token_id), tok, style="offsets")
    board = {
        "size": 3,
        "holes": [],
        "starts": [[0, 0], [2, 2]],
        "goals": [[0, 1], [2, 1]],
        "plan": "Agent 0: RIGHT\nAgent 1: LEFT",
    }
    batch = sft.sft_batch(policy, [board, board], answer_length=40)
    ids = tok(board["plan"] + IM_END, add_special_tokens=False)["input_ids"]
    assert batch["completion_mask"][0].sum() == len(ids)
    assert batch["completion_ids"][0, : len(ids)].tolist() == ids
    assert (batch["completion_ids"][0, len(ids) :] == tok.pad_token_id).all()
    assert batch["prompt_mask"][0, -1] and batch["prompt_ids"].shape[1] % 64 == 0
    short = sft.sft_batch(policy, [board], answer_length=3)
    assert short["completion_mask"].sum() == 3
