"""rl/step.py: one GRPO step with a scripted policy and a recording trainer (no model): dynamic
sampling's rounds and selection, the no-signal rule, old and reference log-probs, iterations."""

from typing import NamedTuple

import numpy as np

from t2t_jax.config.defaults import base
from t2t_jax.rl.step import StepSettings, grpo_step
from t2t_jax.rollout import Rollouts


class State(NamedTuple):
    params: str
    updates: int


def rollouts(boards, valid_per_row, n):
    """Rows i * n + j: sample j of board i, valid as given; every other field a plain array."""
    rows = len(boards) * n
    valid = np.asarray(valid_per_row, np.float32)
    return Rollouts(
        boards=[b for b in boards for _ in range(n)],
        texts=[""] * rows,
        prompt_ids=np.ones((rows, 3), np.int32),
        prompt_mask=np.ones((rows, 3), bool),
        completion_ids=np.ones((rows, 2), np.int32),
        completion_mask=np.ones((rows, 2), bool),
        logprobs=np.full((rows, 2), -0.5, np.float32),
        lengths=np.full(rows, 2),
        truncated=np.zeros(rows, bool),
        plans={"actions": np.zeros((rows, 1))},
        verdicts={"valid": valid.astype(bool)},
        terms={"valid": valid, "optimal": np.zeros(rows, np.float32)},
        rewards=valid.copy(),
        guided=np.zeros(rows, bool),
    )


class Policy:
    """Round r's boards get the valid pattern script[r] (one value per row)."""

    def __init__(self, script, n):
        self.script, self.n, self.calls = script, n, []

    def rollout(self, params, boards, n, **kw):
        self.calls.append([b["id"] for b in boards])
        return rollouts(boards, self.script[len(self.calls) - 1], n)


class Trainer:
    def __init__(self):
        self.batches, self.logprob_calls = [], []

    def shard(self, batch):
        return batch

    def logprobs(self, params, batch):
        self.logprob_calls.append(params)
        return np.zeros_like(batch["completion_ids"], np.float32)

    def update(self, state, batch):
        self.batches.append(batch)
        return State(state.params, state.updates + 1), {"loss": 0.25}

    def check_finite(self, metrics):
        assert np.isfinite(metrics["loss"])


def config(**grpo):
    c = base()
    c.grpo.update(prompts=2, group_size=2, dynamic_sampling=True, dynamic_sampling_rounds=2, **grpo)
    return StepSettings.from_config(c)


BOARDS = [{"id": i} for i in range(12)]


def test_dynamic_sampling_keeps_the_groups_that_differ_across_rounds():
    # round 0: group 0 differs, group 1 all-invalid; round 1: group 0 all-valid, group 1 differs.
    policy, trainer = Policy([[1, 0, 0, 0], [1, 1, 0, 1]], n=2), Trainer()
    out = grpo_step(policy, trainer, config(num_iterations=2), State("p", 0), {}, BOARDS, 0, {"valid": 1.0}, 0)
    assert policy.calls == [[0, 1], [2, 3]]  # stops after the round that completes the batch
    assert [b["id"] for b in out.rollouts.boards] == [0, 0, 3, 3]
    assert out.state.updates == 2 and len(trainer.batches) == 2 and out.metrics["no_signal"] == 0.0
    adv = trainer.batches[0]["advantages"]
    assert (adv[[0, 3]] > 0).all() and (adv[[1, 2]] < 0).all()  # the valid sample of each group
    assert len(out.drawn.rewards) == 8 and out.metrics["informative_groups"] == 0.5
    # recompute: old log-probs from the current params (num_iterations > 1), no reference (beta 0)
    assert trainer.logprob_calls == ["p"] and "ref_logps" not in trainer.batches[0]


def test_no_group_differs_means_no_update():
    policy, trainer = Policy([[0, 0, 1, 1]] * 3, n=2), Trainer()
    out = grpo_step(policy, trainer, config(), State("p", 0), {}, BOARDS, 1, {"valid": 1.0}, 5)
    assert policy.calls == [[6, 7], [8, 9], [10, 11]]  # step 1 reads its own slice of the pool
    assert out.state == State("p", 0) and not trainer.batches and out.metrics["no_signal"] == 1.0


def test_sampler_old_logprobs_and_the_reference_model():
    policy, trainer = Policy([[1, 0, 0, 1]], n=2), Trainer()
    out = grpo_step(
        policy, trainer, config(old_logprobs="sampler", beta=0.04), State("p", 0), "ref", BOARDS, 0, {"valid": 1.0}, 0
    )
    batch = trainer.batches[0]
    np.testing.assert_array_equal(batch["old_logps"], out.rollouts.logprobs)
    assert trainer.logprob_calls == ["ref"] and "ref_logps" in batch and out.state.updates == 1
