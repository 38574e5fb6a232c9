"""rl/replay.py: replay of learnable boards (PLR / SFL-style): the p(1-p) score, PLR's replay
distribution against its formula, the draw's share and frequencies, the buffer's update, a GRPO
step that trains on replayed boards, and a stage whose buffer goes through the checkpoint's JSON
and continues exactly."""

import json
from typing import NamedTuple

import numpy as np
import pytest
from test_grpo_step import State, Trainer, rollouts

from t2t_jax.config.defaults import base
from t2t_jax.config.schema import validate
from t2t_jax.rl import replay
from t2t_jax.rl.replay import ReplaySettings
from t2t_jax.rl.rewards import TERMS
from t2t_jax.rl.stage import train_stage
from t2t_jax.rl.step import StepSettings, grpo_step
from t2t_jax.runrecord import RunRecord, RunState


def board(i: int) -> dict:
    """A 5x5 board told apart by its holes (ids 0..124); `id` for the tests' bookkeeping."""
    holes = [[0, i % 5], [1, i // 5 % 5], [2, i // 25 % 5]]
    return {"id": i, "size": 5, "holes": holes, "starts": [[4, 4]], "goals": [[4, 0]], "bucket": 0}


def entry(i: int, score: float, seen: int) -> dict:
    return {"board": board(i), "score": score, "seen": seen}


def test_scores_are_p_times_one_minus_p_of_each_groups_valid_rate():
    valid = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0]
    np.testing.assert_allclose(replay.scores(valid, 4), [0.0, 0.0, 0.1875, 0.25])


def test_probabilities_follow_plrs_rank_and_staleness_mix():
    s = ReplaySettings(share=0.5, size=8, temperature=0.5, staleness=0.2)
    buffer = [entry(0, 0.09, 5), entry(1, 0.25, 0), entry(2, 0.1875, 3)]
    rank = np.array([3.0, 1.0, 2.0])
    p_score = rank**-2.0 / (rank**-2.0).sum()
    p_stale = np.array([1.0, 6.0, 3.0]) / 10.0
    np.testing.assert_allclose(replay.probabilities(s, buffer, 6), 0.8 * p_score + 0.2 * p_stale)
    # every board trained on at this step: staleness is uniform
    fresh = [entry(0, 0.09, 6), entry(1, 0.25, 6)]
    np.testing.assert_allclose(replay.probabilities(s, fresh, 6), 0.8 * np.array([0.2, 0.8]) + 0.2 * 0.5)
    # tied scores share their average rank (1.5, 1.5, 3); a board sampled after `step` counts 0 steps stale
    tied = [entry(0, 0.25, 9), entry(1, 0.25, 2), entry(2, 0.1, 4)]
    w = np.array([1.5, 1.5, 3.0]) ** -2.0
    np.testing.assert_allclose(replay.probabilities(s, tied, 6), 0.8 * w / w.sum() + 0.2 * np.array([0, 4, 2]) / 6)


def test_a_tiny_temperature_is_greedy_not_an_error():
    s = ReplaySettings(share=0.5, size=64, temperature=1e-3, staleness=0.0)
    buffer = [entry(i, 0.01 * (i + 1), 0) for i in range(20)]  # the best: ids 19, 18, ...
    boards, k = replay.mix(s, buffer, [board(100 + i) for i in range(16)], (1, 2, 3), 4)
    assert k == 8 and sorted(b["id"] for b in boards[:8]) == list(range(12, 20))
    assert np.isfinite(replay.probabilities(s, buffer, 4)).all()


def test_mix_replays_its_share_first_distinct_and_deterministic():
    s = ReplaySettings(share=0.5, size=8)
    buffer = [entry(i, 0.25 - 0.01 * i, 0) for i in range(6)]
    fresh = [board(100 + i) for i in range(8)]
    boards, k = replay.mix(s, buffer, fresh, (3, 7, 0), 5)
    assert k == 4 and len(boards) == 8
    assert len({b["id"] for b in boards[:4]}) == 4 and all(b["id"] < 6 for b in boards[:4])
    assert [b["id"] for b in boards[4:]] == [100, 101, 102, 103]
    assert replay.mix(s, buffer, fresh, (3, 7, 0), 5) == (boards, 4)
    # never more than the buffer holds, nor a board an earlier round took; floor(share x prompts)
    assert replay.mix(ReplaySettings(share=0.9), buffer[:2], fresh, 0, 5)[1] == 2
    taken = frozenset(replay.key(board(i)) for i in range(4))
    assert {b["id"] for b in replay.mix(s, buffer, fresh, 0, 5, taken)[0][:2]} == {4, 5}
    assert replay.mix(ReplaySettings(share=0.9), buffer, fresh[:1], 0, 5) == (fresh[:1], 0)
    # an empty buffer or share 0 leaves the fresh boards
    assert replay.mix(s, [], fresh, 0, 5) == (fresh, 0)
    assert replay.mix(ReplaySettings(share=0.0), buffer, fresh, 0, 5) == (fresh, 0)


def test_single_draws_follow_the_replay_distribution():
    s = ReplaySettings(share=1.0, size=8, temperature=1.0, staleness=0.3)
    buffer = [entry(0, 0.25, 2), entry(1, 0.2, 0), entry(2, 0.1, 4), entry(3, 0.05, 1)]
    want = replay.probabilities(s, buffer, 4)
    draws = 4000
    counts = np.zeros(4)
    for seed in range(draws):
        counts[replay.mix(s, buffer, [board(9)], seed, 4)[0][0]["id"]] += 1
    # each frequency within 4 binomial standard errors of its probability
    assert np.all(np.abs(counts / draws - want) < 4 * np.sqrt(want * (1 - want) / draws)), (counts / draws, want)


def test_update_rescores_drops_the_unlearnable_and_keeps_the_most_learnable():
    s = ReplaySettings(share=0.5, size=3)
    buffer = [entry(0, 0.25, 0), entry(1, 0.1875, 0)]
    # groups of 2: board 0 now always solved (score 0: leaves), board 5 half (0.25), board 6
    # never (0: not kept), board 1 half (re-scored to 0.25, not duplicated)
    valid = [1, 1, 1, 0, 0, 0, 0, 1]
    out = replay.update(s, buffer, [board(0), board(5), board(6), board(1)], valid, 2, 9)
    assert [(e["board"]["id"], e["score"], e["seen"]) for e in out] == [(1, 0.25, 9), (5, 0.25, 9)]
    more = replay.update(s, out, [board(7), board(8)], [1, 0, 1, 0], 2, 10)
    assert [e["board"]["id"] for e in more] == [7, 8, 1]  # size 3: ties go to the most recently seen
    assert replay.update(ReplaySettings(share=0.0), buffer, [board(5)], [1, 0], 2, 9) == buffer
    # a board in two groups of a step is scored over all its samples (3 of 4 valid: 0.1875)
    assert replay.update(s, [], [board(3), board(3)], [1, 0, 1, 1], 2, 1) == [entry(3, 0.1875, 1)]


@pytest.mark.parametrize(
    "key, value",
    [
        ("replay", 1.0),
        ("replay", -0.1),
        ("replay", float("nan")),
        ("replay_size", 0),
        ("replay_size", 10**6),
        ("replay_temperature", 0.0),
        ("replay_staleness", 1.5),
    ],
)
def test_the_schema_names_a_bad_replay_setting(key, value):
    c = base()
    c.grpo[key] = value
    with pytest.raises(ValueError, match=f"grpo.{key}"):
        validate(c)


class Verdicts(NamedTuple):  # (what the stage's logging reads of the validator's)
    valid: np.ndarray
    optimal: np.ndarray


class Policy:
    """A board's samples are valid in the pattern `pattern(board id)` (one value per sample)."""

    def __init__(self, n):
        self.n, self.calls = n, []

    def rollout(self, params, boards, n, **kw):
        self.calls.append([b["id"] for b in boards])
        ro = rollouts(boards, [v for b in boards for v in self.pattern(b["id"])], n)
        ro.terms = {t: ro.terms.get(t, np.zeros_like(ro.rewards)) for t in TERMS}
        ro.verdicts = Verdicts(valid=ro.terms["valid"] > 0, optimal=ro.terms["optimal"] > 0)
        return ro

    def pattern(self, i):
        return [1, 0] if i % 3 == 0 else [0, 0]  # ids 0, 3, 6, ... learnable


def settings(**grpo):
    c = base()
    c.grpo.update(prompts=4, group_size=2, replay=0.5, **grpo)
    return c, StepSettings.from_config(c)


def test_a_grpo_step_trains_on_replayed_boards():
    _, g = settings()
    policy, trainer = Policy(2), Trainer()
    buffer = [entry(90, 0.25, 0), entry(91, 0.25, 0), entry(92, 0.25, 0)]
    out = grpo_step(policy, trainer, g, State("p", 0), {}, [board(i) for i in range(8)], 1, {"valid": 1.0}, 1, buffer)
    assert sorted(policy.calls[0][:2]) in ([90, 91], [90, 92], [91, 92]) and policy.calls[0][2:] == [4, 5]
    assert out.metrics["replayed"] == 0.5 and len(trainer.batches) == 1


def test_dynamic_sampling_rounds_never_replay_a_board_twice_and_count_the_trained_share():
    _, g = settings(dynamic_sampling=True, dynamic_sampling_rounds=2)
    policy = Policy(2)
    buffer = [entry(0, 0.25, 0), entry(3, 0.25, 0), entry(6, 0.25, 0), entry(9, 0.25, 0)]
    fresh = [board(i) for i in range(40, 64) if i % 3]  # (never learnable: all-invalid groups)
    out = grpo_step(policy, Trainer(), g, State("p", 0), {}, fresh, 0, {}, 1, buffer)
    replayed = [i for call in policy.calls for i in call[:2]]
    assert len(policy.calls) == 2 and len(set(replayed)) == 4 and set(replayed) == {0, 3, 6, 9}
    # the four informative groups are the four replayed boards: the whole trained batch
    assert sorted(b["id"] for b in out.rollouts.boards[::2]) == [0, 3, 6, 9] and out.metrics["replayed"] == 1.0


class Loop:
    """What train_stage reads of the stage loop, without a model or a checkpoint on disk."""

    def __init__(self, config, pool):
        self.config, self.pool, self.progress = config, pool, False
        self.policy, self.writer = Policy(2), type("W", (), {"scalars": print, "text": print})()

    def guard(self, run, fn):
        return fn()

    def draw(self, env, key, num):
        return self.pool[:num], {}

    def grpo_key(self, *a):
        return 0

    def save(self, run):
        return run


def test_a_stage_carries_its_buffer_through_the_checkpoints_json_and_continues_exactly():
    c, _ = settings()
    c.grpo.steps = 6
    c.checkpoint.every = 100
    c.logging.text_every = 1000
    env = json.dumps({"max_size": 5, "max_agents": 2, "buckets": [{"size": [5, 5], "agents": 1}]})
    start = RunRecord.start(json.loads(env), {"valid": 1.0}, sft=False)
    start.phase = "grpo"
    pool = [board(i) for i in range(c.grpo.steps * c.grpo.prompts)]
    whole = train_stage(Loop(c, pool), RunState(State("p", 0), {}, start), Trainer())
    assert whole.record.replay and all(e["score"] == 0.25 for e in whole.record.replay)
    assert sum(p["replayed"] for p in whole.record.trajectory) > 0
    # the same stage stopped after 3 steps, its record through JSON (as a checkpoint keeps it)
    c.grpo.steps = 3
    half = train_stage(Loop(c, pool), RunState(State("p", 0), {}, start), Trainer())
    c.grpo.steps = 6
    record = RunRecord.from_json(json.loads(json.dumps(half.record.to_json())), c)
    rest = train_stage(Loop(c, pool), RunState(half.train, {}, record), Trainer())
    assert rest.record.replay == whole.record.replay and rest.record.trajectory == whole.record.trajectory
