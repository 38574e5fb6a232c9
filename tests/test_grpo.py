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
        parts = [float(grpo.policy_loss(logps[i::2], old[i::2], None, adv[i::2], mask[i::2], cfg, totals=totals)[0])
                 for i in range(2)]
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
    cfg = types.SimpleNamespace(loss_type="ppo", epsilon_low=0.2, epsilon_high=0.2, beta=0.0)
    logps, old, ref, adv, mask = inputs(0)
    with pytest.raises(ValueError, match="loss_type: 'ppo'"):
        grpo.policy_loss(logps, old, None, adv, mask, cfg)
