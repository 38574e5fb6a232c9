"""Issue 33's engineer: thinking then a constrained answer, failure cases that show the answer,
the plan and the first violation after long reasoning, truncation counts, environment statistics."""

import json
import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t_jax.engineer import context, propose
from t2t_jax.engineer.engineer import Engineer, Proposal
from t2t_jax.env.config import make_config
from t2t_jax.evaluation.points import EvalSettings, Evaluator, Point
from t2t_jax.models import qwen3
from t2t_jax.rl.rewards import ACCURACY_FIRST
from t2t_jax.rollout import Policy
from t2t_jax.sampling import Engine, Sampler
from t2t_jax.sampling.constrained import advance, allowed_mask
from t2t_jax.sampling.sampler import SampleOutput
from t2t_jax.text.parsing import END_THINK, THINK
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

TOK = load_tokenizer()
CONFIG = make_config([{"size": [3, 4], "agents": 2, "hole_density": [0.0, 0.2]}])
SCHEMA = propose.proposal_schema(CONFIG, (1, 5), 1)
ANSWER = {
    "edits": [
        {"agents": [2, 2], "bucket": 0, "hole_density": [0.0, 0.1], "min_distance": 1, "size": [3, 3], "weight": 1.0}
    ],
    "reward_weights": {"efficiency": 0.0, "length": 0.0, "optimal": 0.5, "valid": 1.0},
}
REASONING = "Agent 0 keeps walking into holes; bucket 0 is too hard, so shrink it to 3x3 {not json["


def engineer_config(**changes):
    return types.SimpleNamespace(
        **{
            "kind": "self",
            "edit_mode": "selective",
            "evidence": "raw",
            "failure_cases": 1,
            "constrained": True,
            "max_tokens": 200,
            "thinking": True,
            "thinking_tokens": 64,
            "temperature": 1.0,
            "top_p": 1.0,
            "agent_range": (1, 5),
            "max_edits": 1,
            "sections": "statistics,breakdown,training,cases,history",
            "efficiency_threshold": 0.6,
            **changes,
        }
    )


class ScriptedSampler:
    """A policy's sampler that writes `script` (token ids), each token checked against the
    constraint's automaton as the jitted samplers apply it (a token it forbids fails the test)."""

    def __init__(self, script):
        self.script, self.stop_ids, self.calls = list(script), jnp.asarray(stop_ids(TOK)), []

    def generate(self, ids, mask, max_new_tokens, constraint=None, **kw):
        self.calls.append(max_new_tokens)
        state = jnp.array([int(constraint.initial)])
        for t in self.script:
            assert bool(allowed_mask(constraint, state, len(TOK), self.stop_ids)[0, t]), TOK.decode([t])
            state = advance(constraint, state, jnp.array([t]))
        row = self.script[:max_new_tokens]
        tokens = np.full((1, max_new_tokens), TOK.pad_token_id, np.int32)
        tokens[0, : len(row)] = row
        cut = row[-1] not in stop_ids(TOK)
        return SampleOutput(
            tokens=tokens, logprobs=np.zeros(tokens.shape), lengths=np.array([len(row)]), truncated=np.array([cut])
        )


def account():
    boards = [{"size": 3, "holes": [], "starts": [[0, 0], [2, 2]], "goals": [[0, 2], [2, 0]], "bucket": 0}]
    ro = scored(boards, ["Agent 0: RIGHT RIGHT\nAgent 1: UP UP"], [False])  # (a collision at (0, 2))
    return context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=1)


def scored(boards, texts, truncated):
    """Rollouts of given completion texts (the policy's parser, validator and rewards)."""
    n = len(texts)
    policy = Policy(None, TOK, max_size=10, max_agents=5)
    lengths = np.full(n, 8)
    return policy.score(
        boards,
        texts,
        np.asarray(truncated),
        lengths,
        16,
        ACCURACY_FIRST,
        prompt=(np.zeros((n, 4), np.int32), np.ones((n, 4), bool)),
        tokens=np.zeros((n, 16), np.int32),
        logprobs=np.zeros((n, 16), np.float32),
    )


def test_scripted_reasoning_then_constrained_json():
    """Free reasoning (text the JSON schema forbids) inside the think block, then the answer under
    the schema: the record keeps them apart and parses the answer only."""
    vocab = TOK.get_vocab()
    answer = json.dumps(ANSWER, separators=(",", ":"))
    script = [vocab[THINK], *TOK.encode(REASONING), vocab[END_THINK], *TOK.encode("\n\n" + answer), stop_ids(TOK)[0]]
    sampler = ScriptedSampler(script)
    engineer = Engineer(engineer_config(), Policy(sampler, TOK))
    record = engineer.propose(None, account(), CONFIG, CONFIG, ACCURACY_FIRST)
    assert record.reasoning == REASONING and json.loads(record.text) == ANSWER and record.parsed == ANSWER
    assert record.accepted and record.config["buckets"][0]["size"] == 3
    assert sampler.calls == [200 + 64 + 2]  # max_tokens + thinking_tokens + <think> and </think>
    assert "First violation: step 2: agent 0 collided with agent 1 at (0, 2)" in record.prompt
    # the record round-trips, and a record of an older run (no reasoning key) still loads
    assert Proposal.from_json(json.loads(json.dumps(record.to_json()))).reasoning == REASONING
    old = {k: v for k, v in record.to_json().items() if k != "reasoning"}
    assert Proposal.from_json(old).reasoning is None and "reasoning" not in Proposal.from_json(old).to_json()


def test_the_automaton_forces_the_answer_at_the_budget_and_constrains_only_the_answer():
    vocab, stops = TOK.get_vocab(), jnp.asarray(stop_ids(TOK))
    c = propose.constraint_for(SCHEMA, TOK, 3)
    state = jnp.array([int(c.initial)])
    allowed = lambda: np.asarray(allowed_mask(c, state, len(TOK), stops)[0])  # noqa: E731
    assert np.flatnonzero(allowed()).tolist() == [vocab[THINK]]  # the block opens first
    state = advance(c, state, jnp.array([vocab[THINK]]))
    for word in TOK.encode("a") * 3:
        assert allowed().sum() == len(TOK) - len(stop_ids(TOK)) and not allowed()[stop_ids(TOK)].any()
        state = advance(c, state, jnp.array([word]))
    assert np.flatnonzero(allowed()).tolist() == [vocab[END_THINK]]  # the budget (3) spent
    state = advance(c, state, jnp.array([vocab[END_THINK]]))
    assert allowed()[TOK.encode("{")[0]] and not allowed()[TOK.encode("free")[0]]  # the schema holds
    opened = propose.constraint_for(SCHEMA, TOK, 3, opened=True)
    assert bool(opened.free[int(opened.initial)])  # a template that opened the block: reasoning first


@pytest.mark.parametrize("engine", [False, True])
def test_tiny_model_thinks_then_writes_schema_json(engine):
    """The tiny model (random weights) with the static sampler and the continuous engine: its
    reasoning is free, its answer always parses, and the proposal is never rejected as bad JSON."""
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
    stops = stop_ids(TOK)
    sampler = Engine(model, stops, TOK.pad_token_id, slots=2, chunk=16) if engine else Sampler(model, stops, 0)
    engineer = Engineer(engineer_config(thinking_tokens=24), Policy(sampler, TOK))
    for stage in range(2):
        a = account().replace(stage=stage)
        record = engineer.propose(None, a, CONFIG, CONFIG, ACCURACY_FIRST)
        assert record.reasoning is not None and "not valid JSON" not in record.reason
        json.loads(record.text)
        assert record.accepted or record.reason.startswith("rejected: ")


def test_failure_case_after_long_reasoning_shows_the_answer_plan_and_first_violation():
    # agent 0 walks right into the hole at (0, 2) at step 2; agent 1 is fine
    board = {"size": 4, "holes": [[0, 2]], "starts": [[0, 0], [3, 3]], "goals": [[0, 3], [3, 0]], "bucket": 0}
    plan = "Agent 0: RIGHT RIGHT RIGHT\nAgent 1: LEFT LEFT LEFT"
    text = f"{THINK}\n" + "Let me think about agent 0. " * 400 + f"\n{END_THINK}\n\nMy plan:\n{plan}"
    ro = scored([board], [text], [False])
    a = context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=1)
    case = a.failure_cases[0]
    assert case["plan"] == plan and case["answer"].endswith(plan) and case["reasoning_chars"] > 10000
    assert case["verdict"] == ["hole"] and case["violation"] == "step 2: agent 0 fell into the hole at (0, 2)"
    prompt = context.account_text(a)
    assert f"Plan read: {plan}" in prompt and "First violation: step 2: agent 0 fell into the hole" in prompt
    assert "Let me think" not in prompt and len(prompt) < 3000  # the reasoning is counted, not shown
    # every kind of first violation, named with its agents and cells
    assert context.first_violation(board, [["UP"], ["STAY"]]) == "step 1: agent 0 left the grid (moving UP from (0, 0))"
    two = {"size": 3, "holes": [], "starts": [[0, 0], [0, 2]], "goals": [[0, 2], [0, 0]]}
    assert context.first_violation(two, [["RIGHT"], ["LEFT"]]) == "step 1: agent 0 collided with agent 1 at (0, 1)"
    two = {**two, "starts": [[0, 0], [0, 1]], "goals": [[0, 1], [0, 0]]}
    assert context.first_violation(two, [["RIGHT"], ["LEFT"]]) == (
        "step 1: agent 0 swapped cells with agent 1 ((0, 0) <-> (0, 1))"
    )
    assert context.first_violation(two, [[], None]) == "agent 0 ends at (0, 0), not on its goal (0, 1)"
    # a think block that never closed: no answer, no plan, said so
    open_ro = scored([board], [f"{THINK}\nstill thinking"], [True])
    case = context.build_account(0, CONFIG, ACCURACY_FIRST, open_ro, cases=1).failure_cases[0]
    assert case["answer"] is None and case["plan"] is None and "truncated" in case["verdict"]
    assert "never closed" in context.case_text(case)


def test_truncation_is_counted_in_the_account_and_at_each_evaluation_point():
    board = {"size": 3, "holes": [], "starts": [[0, 0]], "goals": [[0, 2]], "bucket": 0, "optimal_makespan": 2}
    ro = scored([board] * 4, ["Agent 0: RIGHT RIGHT", "Agent 0: RIGHT", "Agent 0: RIGHT RI", "Agent 0:"], [0, 0, 1, 1])
    a = context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=0)
    assert a.overall["truncated"] == 0.5 and a.overall["failures"]["truncated"] == 2
    assert a.buckets[0]["truncated"] == 0.5 and "cut by the token budget 0.50" in context.account_text(a)
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
    policy = Policy(Sampler(model, [], TOK.pad_token_id), TOK, style="compact")  # (no stop: every row is cut)
    settings = EvalSettings(
        max_new_tokens=3, batch_size=4, reward_weights=ACCURACY_FIRST, temperature=1.0, top_p=1.0, seed=0
    )
    entry, values = Evaluator(policy, settings).point("stage_0", None, [board, board], [])
    assert entry.truncated == 1.0 and values["benchmark/truncated"] == 1.0
    old = {k: v for k, v in entry.to_json().items() if k != "truncated"}
    assert Point.from_json(old).truncated is None  # results of older runs still load


def test_environment_statistics_of_trained_and_evaluated_boards():
    boards = [
        {
            "size": 4,
            "holes": [[1, 1], [2, 2]],
            "starts": [[0, 0], [3, 3]],
            "goals": [[0, 3], [3, 0]],
            "bucket": 0,
            "optimal_makespan": 3,
        },
        {"size": 6, "holes": [], "starts": [[0, 0], [5, 5]], "goals": [[5, 5], [0, 0]], "bucket": 0},
        {
            "size": 5,
            "holes": [[0, 1]] * 5,
            "starts": [[0, 0], [4, 4], [2, 2]],
            "goals": [[1, 0], [4, 3], [2, 4]],
            "bucket": 1,
            "optimal_makespan": 2,
        },
    ]
    stats = context.environment_stats([context.board_sums(boards[:1]), context.board_sums(boards[1:])])
    assert stats == [
        # size (4+6)/2; density (2/16 + 0)/2; optimum 3 (one board has one); distance (3 + 10)/2
        {
            "bucket": 0,
            "boards": 2,
            "size": 5.0,
            "agents": 2.0,
            "hole_density": round(0.0625, 3),
            "optimal_makespan": 3.0,
            "distance": 6.5,
        },
        {
            "bucket": 1,
            "boards": 1,
            "size": 5.0,
            "agents": 3.0,
            "hole_density": 0.2,
            "optimal_makespan": 2.0,
            "distance": round(4 / 3, 3),
        },
    ]
    ro = scored(boards, ["Agent 0: STAY"] * 3, [False] * 3)
    trajectory = [{"reward": 0.0, "valid": 0.0, "env": context.board_sums(boards[:2])}, {"reward": 0.0, "valid": 0.0}]
    a = context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=0, trajectory=trajectory)
    assert a.environment["trained"] == stats[:1] and a.environment["evaluated"] == stats
    assert "Boards trained, bucket 0: 2 boards, mean size 5.0" in context.account_text(a)
    old = {k: v for k, v in a.to_json().items() if k != "environment"}
    assert context.Account.from_json(old).environment is None and "Boards" not in context.account_text(old)
    # The share the certified generator replaced: step 0's pool counts, the held-out draw's.
    trajectory[0]["replaced"] = {"0": {"generated": 8, "replaced": 2}}
    held = {"0": {"generated": 4, "replaced": 0}, "1": {"generated": 5, "replaced": 5}}
    a = context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=0, trajectory=trajectory, replaced=held)
    assert [e["replaced"] for e in a.environment["trained"]] == [0.25]
    assert [e["replaced"] for e in a.environment["evaluated"]] == [0.0, 1.0]
    assert "Boards trained, bucket 0: 2 boards" in context.account_text(a)
    assert "replaced by the generator 0.25" in context.account_text(a)
    assert context.environment_stats([context.board_sums(boards)], {})[0]["replaced"] is None  # (none generated)
