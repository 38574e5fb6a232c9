"""GRPO losses against a NumPy reference written from the formulas (TRL's definitions)."""

import types

import numpy as np
import pytest

from t2t_jax.rl import grpo


def numpy_loss(logps, old, ref, adv, mask, cfg, chunks=1):
    ratio = np.exp(logps - old)
    clipped = np.clip(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    a = adv[:, None]
    per = -np.minimum(ratio * a, clipped * a)
    if cfg.beta:
        d = ref - logps
        per = per + cfg.beta * (np.exp(d) - d - 1)
    m = mask.astype(np.float64)
    b, t = mask.shape
    if cfg.loss_type == "grpo":
        return np.mean((per * m).sum(1) / np.maximum(m.sum(1), 1))
    if cfg.loss_type == "bnpo":
        return (per * m).sum() / max(m.sum(), 1) / chunks
    if cfg.loss_type == "dr_grpo":
        return (per * m).sum() / (b * t)
    return (per * m).sum() / max(m.sum(), 1)  # dapo


def inputs(seed, b=6, t=7):
    rng = np.random.default_rng(seed)
    logps = -rng.uniform(0.1, 4, (b, t))
    old = logps + rng.normal(0, 0.3, (b, t))
    ref = logps + rng.normal(0, 0.3, (b, t))
    adv = rng.normal(size=b)
    mask = np.arange(t)[None] < rng.integers(0, t + 1, b)[:, None]
    return logps, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", sorted(grpo.LOSSES))
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_policy_loss_matches_numpy(loss_type, beta):
    cfg = types.SimpleNamespace(loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=beta)
    for seed in range(3):
        logps, old, ref, adv, mask = inputs(seed)
        loss, metrics = grpo.policy_loss(logps, old, ref if beta else None, adv, mask, cfg)
        np.testing.assert_allclose(float(loss), numpy_loss(logps, old, ref, adv, mask, cfg), rtol=1e-5, atol=1e-6)
        ratio = np.exp(logps - old)
        m = mask.astype(bool)
        low = ((ratio < 0.8) & (adv[:, None] < 0))[m].mean()
        high = ((ratio > 1.28) & (adv[:, None] > 0))[m].mean()
        np.testing.assert_allclose(float(metrics["clip_low"]), low, atol=1e-6)
        np.testing.assert_allclose(float(metrics["clip_high"]), high, atol=1e-6)
        np.testing.assert_allclose(float(metrics["ratio"]), ratio[m].mean(), rtol=1e-5)
        np.testing.assert_allclose(float(metrics["entropy"]), -logps[m].mean(), rtol=1e-5)


def test_micro_batch_shares_sum_to_full_batch():
    cfg = types.SimpleNamespace(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2, beta=0.0)
    logps, old, ref, adv, mask = inputs(5, b=8)
    full = float(grpo.policy_loss(logps, old, None, adv, mask, cfg)[0])
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        cfg.loss_type = loss_type
        full = float(grpo.policy_loss(logps, old, None, adv, mask, cfg)[0])
        totals = grpo.totals_of(mask, chunks=2)
        parts = [
            float(grpo.policy_loss(logps[i::2], old[i::2], None, adv[i::2], mask[i::2], cfg, totals=totals)[0])
            for i in range(2)
        ]
        np.testing.assert_allclose(sum(parts), full, rtol=1e-5, err_msg=loss_type)


def test_group_advantages():
    r = np.array([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 3.0])
    a = np.asarray(grpo.group_advantages(r, 4, "group"))
    g = r.reshape(2, 4)
    want = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(a, want.reshape(-1), rtol=1e-5)
    b = np.asarray(grpo.group_advantages(r, 4, "batch"))
    np.testing.assert_allclose(b, ((g - g.mean(1, keepdims=True)) / (r.std(ddof=1) + 1e-4)).reshape(-1), rtol=1e-5)
    n = np.asarray(grpo.group_advantages(r, 4, "none"))
    np.testing.assert_allclose(n, (g - g.mean(1, keepdims=True)).reshape(-1), rtol=1e-6)
    same = np.asarray(grpo.group_advantages(np.ones(4), 4, "group"))
    assert np.all(same == 0)
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo.group_advantages(r, 4, "rank")


def test_unknown_loss_type_is_named():
    with pytest.raises(ValueError, match="grpo.loss_type: 'ppo' is not one of"):
        grpo.LossSettings(loss_type="ppo")
    assert grpo.LossSettings.from_config(
        {"loss_type": "grpo", "epsilon_low": 0.1, "epsilon_high": 0.3, "beta": 0.0, "other": 1}
    ) == grpo.LossSettings("grpo", 0.1, 0.3, 0.0)


def test_dynamic_sampling_never_takes_a_group_twice():
    """The batch that once came out [r0g2, r1g1, r2g0, r2g0]: one informative group per round,
    four wanted. The fill comes from the last round's groups not taken yet."""
    informative = [np.array([0, 0, 1, 0], bool), np.array([0, 1, 0, 0], bool), np.array([1, 0, 0, 0], bool)]
    picks = grpo.select_groups(informative, 4)
    assert picks == [(0, 2), (1, 1), (2, 0), (2, 1)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        rounds = [rng.random(4) < rng.random() for _ in range(rng.integers(1, 4))]
        picks = grpo.select_groups(rounds, 4)
        assert len(picks) == 4 and len(set(picks)) == 4
        assert [p for p in picks if rounds[p[0]][p[1]]] == [
            (r, g) for r, m in enumerate(rounds) for g in np.flatnonzero(m)
        ][:4]  # informative ones first


def test_informative_groups_key_on_accuracy_unless_asked():
    # group 0 differs in length only, group 1 in validity, group 2 not at all
    terms = {"valid": np.array([1, 1, 0, 1, 0, 0], np.float32), "optimal": np.zeros(6, np.float32)}
    rewards = np.array([1.0, 0.9, 0.0, 1.0, 0.0, 0.0])
    assert grpo.informative_groups(terms, rewards, 2).tolist() == [False, True, False]
    assert grpo.informative_groups(terms, rewards, 2, "reward").tolist() == [True, True, False]
    optimal_only = {"valid": np.ones(2, np.float32), "optimal": np.array([1, 0], np.float32)}
    assert grpo.informative_groups(optimal_only, np.ones(2), 2).tolist() == [True]
    with pytest.raises(ValueError, match="grpo.informative: 'total'"):
        grpo.informative_groups(terms, rewards, 2, "total")


def test_shuffle_control_permutes_within_groups():
    adv = np.arange(32, dtype=np.float32)
    out = grpo.shuffle_within_groups(adv, 8, seed=3)
    for g in range(4):
        assert sorted(out[8 * g : 8 * g + 8]) == list(adv[8 * g : 8 * g + 8])
    assert not np.array_equal(out, adv)
    np.testing.assert_array_equal(out, grpo.shuffle_within_groups(adv, 8, seed=3))
    assert not np.array_equal(out, grpo.shuffle_within_groups(adv, 8, seed=4))


def test_log_ratio_is_clamped_before_exp():
    cfg = types.SimpleNamespace(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, beta=0.0)
    logps, old = np.zeros((2, 3)), np.array([[-200.0, 0, 0], [0, 0, 0]])  # exp(200) overflows float32
    loss, metrics = grpo.policy_loss(logps, old, None, np.array([-1.0, 1.0]), np.ones((2, 3)), cfg)
    assert np.isfinite(float(loss)) and np.isfinite(float(metrics["ratio"]))
    assert float(metrics["ratio"]) == pytest.approx((np.exp(20.0) + 5) / 6, rel=1e-5)


def test_batch_advantages_zero_the_fill_and_shuffle_under_control():
    rewards = np.array([1.0, 0.0, 1.2, 1.1, 0.0, 1.0])  # group 1 differs in a shaping term only
    plain = np.asarray(grpo.group_advantages(rewards, 2))
    out = grpo.batch_advantages(rewards, 2, signal=[True, False, True])
    np.testing.assert_allclose(out, plain * [1, 1, 0, 0, 1, 1])
    shuffled = grpo.batch_advantages(rewards, 2, signal=[True, False, True], control="shuffle", seed=0)
    for g in range(3):
        assert sorted(shuffled[2 * g : 2 * g + 2]) == sorted(out[2 * g : 2 * g + 2])
    np.testing.assert_allclose(grpo.batch_advantages(rewards, 2), plain)
    with pytest.raises(ValueError, match="grpo.control: 'flip'"):
        grpo.batch_advantages(rewards, 2, control="flip")
