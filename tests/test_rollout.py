"""Rollouts: off-policy guidance puts a certified plan into groups without a valid sample."""

import numpy as np
import pytest
from flax import nnx

from t2t_jax.models import qwen3
from t2t_jax.rl.rewards import ACCURACY_FIRST
from t2t_jax.rollout import Policy, guide
from t2t_jax.sampling import Sampler
from t2t_jax.text.tokenizer import IM_END, load_tokenizer, stop_ids

BOARDS = [
    {
        "size": 3,
        "holes": [],
        "starts": [[0, 0], [2, 2]],
        "goals": [[0, 1], [2, 1]],
        "optimal_makespan": 1,
        "plan": "Agent 0: RIGHT\nAgent 1: LEFT",
    },
    {
        "size": 3,
        "holes": [[1, 1]],
        "starts": [[0, 0], [2, 0]],
        "goals": [[1, 0], [2, 1]],
        "optimal_makespan": 1,
        "plan": "Agent 0: DOWN\nAgent 1: RIGHT",
    },
]


def scored(policy, texts, group, width=24):
    rows = [b for b in BOARDS for _ in range(group)]
    ids, mask = policy.encode(rows)
    tokens = np.zeros((len(texts), width), np.int32)
    return policy.score(
        rows,
        texts,
        np.zeros(len(texts), bool),
        np.full(len(texts), 5),
        64,
        ACCURACY_FIRST,
        prompt=(ids, mask),
        tokens=tokens,
        logprobs=np.full(tokens.shape, -1.0, np.float32),
    )


@pytest.fixture(scope="module")
def policy():
    tok = load_tokenizer()
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
    return Policy(Sampler(model, stop_ids(tok), tok.pad_token_id), tok, style="offsets")


def test_guidance_replaces_the_last_sample_of_groups_that_all_failed(policy):
    texts = [
        "Agent 0: LEFT\nAgent 1: LEFT",
        "nonsense",
        "Agent 0: UP\nAgent 1: UP",  # board 0: all fail
        "Agent 0: DOWN\nAgent 1: RIGHT",
        "Agent 0: UP\nAgent 1: UP",
        "garbage",
    ]  # board 1: one valid
    ro = scored(policy, texts, group=3)
    assert ro.verdicts.valid.tolist() == [False, False, False, True, False, False]
    out = guide(policy, ro, group_size=3, max_new_tokens=64, reward_weights=ACCURACY_FIRST)
    assert out.guided.tolist() == [False, False, True, False, False, False]
    assert out.texts[2] == BOARDS[0]["plan"] and out.texts[:2] + out.texts[3:] == texts[:2] + texts[3:]
    assert out.verdicts.valid.tolist() == [False, False, True, True, False, False]
    assert out.rewards[2] > out.rewards[:2].max()
    answer = policy.tokenizer(BOARDS[0]["plan"] + IM_END, add_special_tokens=False)["input_ids"]
    assert out.lengths[2] == len(answer) and out.completion_ids[2, : len(answer)].tolist() == answer
    assert out.completion_mask[2].sum() == len(answer) and out.logprobs[2].sum() == 0
    np.testing.assert_array_equal(out.prompt_ids, ro.prompt_ids)


def test_guidance_skips_plans_wider_than_the_completions(policy):
    ro = scored(policy, ["x"] * 4, group=2, width=4)
    out = guide(policy, ro, group_size=2, max_new_tokens=64, reward_weights=ACCURACY_FIRST)
    assert not out.guided.any() and out.texts == ro.texts
