"""The engineer: the semantic check, edit modes, baselines, the account, every kind."""

import dataclasses
import json
import types

import numpy as np
import pytest
from flax import nnx

from t2t_jax.engineer import baselines, context, propose
from t2t_jax.engineer.engineer import KINDS, Engineer
from t2t_jax.env.config import EnvConfig, make_config
from t2t_jax.models import qwen3
from t2t_jax.rl.rewards import ACCURACY_FIRST
from t2t_jax.rollout import Policy
from t2t_jax.sampling import Sampler
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

CONFIG = make_config(
    [
        {"size": [3, 4], "agents": 2, "hole_density": [0.0, 0.2]},
        {"size": [6, 7], "agents": [2, 3], "hole_density": [0.1, 0.3], "weight": 2.0},
    ]
)
EDIT = {"size": [4, 5], "agents": [2, 2], "hole_density": [0.0, 0.2], "min_distance": 1, "weight": 1.0}
REWARDS = {"valid": 1.0, "optimal": 0.5, "efficiency": 0.0, "length": 0.0}


def apply(edits, mode="selective", rewards=REWARDS, agent_range=(1, 5)):
    return propose.apply_proposal(
        {"edits": edits, "reward_weights": rewards}, CONFIG, ACCURACY_FIRST, mode, agent_range
    )


def test_edit_and_bucket_counts_are_capped_and_any_text_is_survived():
    many = [{"bucket": 2, **EDIT}] * 1000
    with pytest.raises(propose.ProposalError, match="1000 edits, at most 4"):
        apply(many)
    with pytest.raises(propose.ProposalError, match="would have 17 buckets, at most 16"):
        propose.apply_proposal(
            {"edits": many[:15], "reward_weights": REWARDS}, CONFIG, ACCURACY_FIRST, "selective", (1, 5), max_edits=100
        )
    for text in ("[" * 1000 + "]" * 1000, "{" * 100000, "not json", ""):
        with pytest.raises(propose.ProposalError, match="not valid JSON"):
            propose.parse_proposal(text)


def test_selective_keeps_unnamed_buckets_and_rewrite_replaces():
    new, weights = apply([{"bucket": 1, **EDIT}])
    assert dataclasses.replace(new.buckets[0], weight=1.0) == CONFIG.buckets[0]  # kept (weights normalised)
    assert new.buckets[1].size == (4, 5) and [b.weight for b in new.buckets] == [0.5, 0.5]
    added, _ = apply([{"bucket": 2, **EDIT}])
    assert len(added.buckets) == 3 and added.buckets[:2] == tuple(
        dataclasses.replace(b, weight=round(b.weight / 4.0, 4)) for b in CONFIG.buckets
    )
    rewritten, _ = apply([{"bucket": 0, **EDIT}], mode="rewrite")
    assert len(rewritten.buckets) == 1 and rewritten.buckets[0].size == (4, 5)
    assert weights["optimal"] == 0.5 and weights["format"] == ACCURACY_FIRST["format"]


@pytest.mark.parametrize(
    "edit, reason",
    [
        ({"bucket": 5, **EDIT}, r"edits\[0\].bucket: 5 is outside the legal range \[0, 2\]"),
        ({"bucket": 0, **EDIT, "size": [5, 3]}, r"size: low 5 is above high 3"),
        ({"bucket": 0, **EDIT, "size": [3, 12]}, r"size: 12 is outside the legal range \[3, 10\]"),
        ({"bucket": 0, **EDIT, "hole_density": [0.0, 0.7]}, r"hole_density: 0.7 is outside"),
        ({"bucket": 0, **EDIT, "size": [3, 3], "agents": [5, 5], "hole_density": [0.5, 0.5]}, r"unsatisfiable"),
        ({"bucket": 0, **EDIT, "agents": [3, 4]}, r"outside the allowed range \[2, 2\]"),
    ],
)
def test_semantic_check_rejects_with_the_reason(edit, reason):
    with pytest.raises(propose.ProposalError, match=reason):
        apply([edit], agent_range=(2, 2) if "allowed" in reason else (1, 5))


def test_semantic_check_rejects_bad_shapes_and_rewards():
    with pytest.raises(propose.ProposalError, match="edits: expected a non-empty list"):
        apply([])
    with pytest.raises(propose.ProposalError, match="bucket 0 is edited twice"):
        apply([{"bucket": 0, **EDIT}, {"bucket": 0, **EDIT}])
    with pytest.raises(propose.ProposalError, match="reward_weights.valid: must be > 0"):
        apply([{"bucket": 0, **EDIT}], rewards={**REWARDS, "valid": 0.0})
    with pytest.raises(propose.ProposalError, match=r"reward_weights.length: 3 is outside"):
        apply([{"bucket": 0, **EDIT}], rewards={**REWARDS, "length": 3})


def fake_account(valid=(0.9, 0.1)):
    buckets = [
        {"bucket": i, "config": b.to_json(), "valid": v, "boards": 10}
        for i, (b, v) in enumerate(zip(CONFIG.buckets, valid))
    ]
    return {"stage": 0, "buckets": buckets, "overall": {"valid": float(np.mean(valid))}}


def test_baselines_give_legal_configs():
    rng = np.random.default_rng(0)
    for name, fn in baselines.BASELINES.items():
        for _ in range(5):
            new, reason = fn(fake_account(), CONFIG, CONFIG, rng, (1, 5))
            assert isinstance(new, EnvConfig) and reason.startswith(name.split("_")[0])
    harder_easier, _ = baselines.frontier(fake_account(), CONFIG, CONFIG, rng, (1, 5))
    assert harder_easier.buckets[0].size == (4, 5)  # 90% valid: harder
    assert harder_easier.buckets[1].size == (5, 6)  # 10% valid: easier
    weighted, _ = baselines.learnability(fake_account((0.5, 1.0)), CONFIG, CONFIG, rng, (1, 5))
    assert weighted.buckets[0].weight > weighted.buckets[1].weight
    assert baselines.fixed(fake_account(), CONFIG, "first", rng, (1, 5))[0] == "first"
    assert baselines.reward_schedule(0.9, 0.6)["efficiency"] > 0 == baselines.reward_schedule(0.1, 0.6)["efficiency"]


def test_wilson_interval():
    assert context.wilson(0, 0) == [0.0, 1.0]
    lo, hi = context.wilson(5, 10)
    assert lo < 0.5 < hi and abs((lo + hi) / 2 - 0.5) < 1e-6
    assert context.wilson(10, 10)[1] == 1.0


@pytest.fixture(scope="module")
def rollouts():
    """Greedy rollouts of a random tiny model on boards of CONFIG (all fail)."""
    import jax

    from t2t_jax.env import io
    from t2t_jax.env.certified import CertifiedGenerator

    tok = load_tokenizer()
    model = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
    policy = Policy(Sampler(model, stop_ids(tok), tok.pad_token_id), tok, style="compact")
    boards = io.boards_with_plans_to_json(*CertifiedGenerator(CONFIG, chunk=64)(jax.random.key(0), 8))
    return policy, policy.rollout(None, boards, n=1, max_new_tokens=24, temperature=0.0, reward_weights=ACCURACY_FIRST)


def test_account_and_every_engineer_kind(rollouts):
    policy, ro = rollouts
    account = context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=2)
    assert [b["boards"] for b in account["buckets"]] == [sum(b["bucket"] == i for b in ro.boards) for i in range(2)]
    assert len(account["failure_cases"]) == 2 and account["overall"]["boards"] == 8
    assert "Legal ranges" in context.account_text(account)
    base = types.SimpleNamespace(
        edit_mode="selective",
        evidence="raw",
        failure_cases=2,
        constrained=True,
        max_tokens=200,
        temperature=1.0,
        top_p=1.0,
        agent_range=(1, 5),
        max_edits=2,
        sections="statistics,breakdown,training,cases,history",
        efficiency_threshold=0.6,
    )
    for kind in [k for k in KINDS if k != "api"]:  # api: tests/test_serving.py, against a server
        for extra in (
            {},
            {"evidence": "summary", "constrained": False, "edit_mode": "rewrite", "max_tokens": 24, "failure_cases": 0},
        ):
            cfg = types.SimpleNamespace(**{**vars(base), "kind": kind, **extra})
            record = Engineer(cfg, policy, base_params=None).propose(None, account, CONFIG, CONFIG, ACCURACY_FIRST)
            json.dumps(record)  # JSON-ready
            assert record["kind"] == kind and isinstance(record["reason"], str) and record["reason"]
            EnvConfig.from_json(record["config"])
            if kind in ("self", "base") and cfg.constrained:
                json.loads(record["text"])  # constrained: always well-formed
                assert record["accepted"] or record["reason"].startswith("rejected: ")
            if kind in ("self", "base") and extra:
                assert record["summary"] is not None or not account["failure_cases"]
            if not record["accepted"]:
                assert record["config"] == CONFIG.to_json()


def test_engineer_rejects_unknown_settings(rollouts):
    policy, _ = rollouts
    cfg = types.SimpleNamespace(kind="oracle", edit_mode="selective", evidence="raw", agent_range=(1, 5))
    with pytest.raises(ValueError, match="engineer.kind: 'oracle'"):
        Engineer(cfg, policy)


@pytest.mark.parametrize("guard", [True, False])
def test_reward_guard_keeps_accuracy_first_below_the_threshold(rollouts, monkeypatch, guard):
    """A review run's tiny engineer set length 1.0 against valid 0.1 at 0% held-out valid, and the
    next stage trained on a reward dominated by length: the guard puts accuracy first."""
    policy, ro = rollouts
    account = context.build_account(0, CONFIG, ACCURACY_FIRST, ro, cases=0)
    assert account["overall"]["valid"] < 0.6
    text = json.dumps(
        {
            "edits": [
                {
                    "bucket": 0,
                    "size": [3, 4],
                    "agents": [2, 2],
                    "hole_density": [0.0, 0.1],
                    "min_distance": 1,
                    "weight": 1.0,
                }
            ],
            "reward_weights": {"valid": 0.1, "length": 1.0, "optimal": 1.0, "efficiency": 0.5},
        }
    )
    monkeypatch.setattr(Engineer, "_decode", lambda *a: (text, False))
    cfg = types.SimpleNamespace(
        kind="self",
        edit_mode="selective",
        evidence="raw",
        failure_cases=0,
        constrained=False,
        max_tokens=200,
        temperature=1.0,
        top_p=1.0,
        agent_range=(1, 5),
        max_edits=2,
        sections="statistics,breakdown,training,cases,history",
        efficiency_threshold=0.6,
        reward_guard=guard,
    )
    record = Engineer(cfg, policy).propose(None, account, CONFIG, CONFIG, ACCURACY_FIRST)
    assert record["accepted"] and record["config"]["buckets"][0]["size"] == [3, 4]
    if guard:
        assert record["reward_weights"] == ACCURACY_FIRST and "engineer.reward_guard" in record["reason"]
    else:
        assert record["reward_weights"]["length"] == 1.0 and record["reason"] == "accepted"


def synthetic_rollouts(cells):
    """Rows for (size, agents, holes, valid, vertex_collision) tuples, all in bucket 0."""
    from t2t_jax.env.types import ParseStatus

    boards = [
        {
            "size": n,
            "starts": [[0, i] for i in range(k)],
            "goals": [[n - 1, i] for i in range(k)],
            "holes": [[1, j] for j in range(h)],
            "bucket": 0,
        }
        for n, k, h, _, _ in cells
    ]
    valid = np.array([c[3] for c in cells], bool)
    flags = {f: np.zeros(len(cells), bool) for f in context.FLAGS}
    flags["vertex_collision"] = np.array([c[4] for c in cells], bool)
    verdicts = types.SimpleNamespace(valid=valid, optimal=valid, all_goals_reached=valid, **flags)
    plans = types.SimpleNamespace(parse_status=np.full(len(cells), int(ParseStatus.OK)))
    return types.SimpleNamespace(
        boards=boards, verdicts=verdicts, plans=plans, lengths=np.full(len(cells), 5), rewards=valid.astype(float)
    )


def test_breakdown_ranks_the_worst_cells_first_within_a_bucket():
    # 4x4 with 2 agents and no holes: all valid; 8x8 with 3 agents and 20% holes (13/64): all
    # fail with collisions; 8x8, 3 agents, no holes: half valid.
    cells = (
        [(4, 2, 0, True, False)] * 3 + [(8, 3, 13, False, True)] * 4 + [(8, 3, 0, True, False), (8, 3, 0, False, True)]
    )
    ro = synthetic_rollouts(cells)
    out = context.breakdown(ro, np.zeros(len(cells), int), limit=8)
    assert [(c["size"], c["agents"], c["holes"], c["valid"]) for c in out] == [
        (8, 3, [0.2, 0.3], 0.0),
        (8, 3, [0.0, 0.1], 0.5),
        (4, 2, [0.0, 0.1], 1.0),
    ]
    assert out[0]["failures"] == {"vertex_collision": 4, "goals_not_reached": 4} and out[0]["boards"] == 4
    assert out[0]["valid_ci"][1] < 0.5 and len(context.breakdown(ro, np.zeros(len(cells), int), limit=1)) == 1
    assert context.hole_band({"size": 10, "holes": [[0, 0]] * 50}) == 4  # 50% holes: the last band, closed


def test_training_details_and_the_account_sections():
    trajectory = [
        {"reward": r, "valid": r, "tokens": 30 - i, "entropy": 1.0, "kl": None, "no_signal": i == 1}
        for i, r in enumerate([0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    ]
    t = context.training_details(trajectory)
    assert t["updates"] == 7 and t["no_signal"] == 1
    assert t["reward"]["first"] == 0.1 and t["reward"]["last"] == 0.65 and t["tokens"]["last"] == 23.5
    assert "kl" not in t and context.training_details([]) == {}
    cells = [(8, 3, 13, False, True)] * 2 + [(4, 2, 0, True, False)] * 2
    account = context.build_account(
        1, CONFIG, ACCURACY_FIRST, synthetic_rollouts(cells), cases=0, trajectory=trajectory
    )
    full = context.account_text(account)
    assert "Worst cells" in full and "Training: 7 updates (1 steps without signal)" in full and "Bucket 0" in full
    only = context.account_text(account, sections=("breakdown",))
    assert "Worst cells" in only and "Bucket 0" not in only and "Training" not in only
    assert context.parse_sections("cases, history") == ("cases", "history")
    with pytest.raises(ValueError, match="engineer.sections: 'stats' is not one of"):
        context.parse_sections("stats")


def test_each_edit_mode_has_its_own_instructions():
    account = context.build_account(0, CONFIG, ACCURACY_FIRST, synthetic_rollouts([(4, 2, 0, True, False)]), cases=0)
    selective = propose.engineer_messages(account, mode="selective")[-1]["content"]
    rewrite = propose.engineer_messages(account, mode="rewrite")[-1]["content"]
    assert "every bucket you do not name is kept" in selective and "kept" not in rewrite
    assert "Buckets you do not list are dropped" in rewrite
