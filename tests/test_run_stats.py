"""run_stats: the tests across training runs against scipy/numpy references, their false-positive
rate over many synthetic null studies (and the board-pooled test's on the same data), and the
power calculation against a simulation."""

import numpy as np
import pytest
from scipy import stats

from t2t_jax.evaluation import benchmark, run_stats


def synthetic_study(rng, runs, boards, effect, run_sd, k=8):
    """Per run the per-board differences (arm - reference) of avg@k valid on the same boards: each
    board has its own solve rate, each training run shifts every board's rate by its own N(0,
    run_sd) (an arm's run also by `effect`), and each (run, board) draws k samples -> n arrays
    (boards,) of values in {-k, ..., k} / k."""
    rate = rng.uniform(0.2, 0.6, boards)

    def run(shift):
        return rng.binomial(k, np.clip(rate + shift + rng.normal(0, run_sd), 0, 1)) / k

    return [run(effect) - run(0.0) for _ in range(runs)]


def enumerate_sign_flips(d):
    """The exact two-sided sign-flip p: the share of all 2^n patterns with |mean| >= |observed|."""
    n = len(d)
    signs = 1.0 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    means = signs @ np.asarray(d) / len(d)
    return float(np.mean(np.abs(means) >= abs(np.mean(d)) - 1e-12))


@pytest.mark.parametrize("effect", [0.0, 0.1])
def test_paired_runs_matches_scipy_and_an_enumeration(effect):
    rng = np.random.default_rng(3)
    diffs = synthetic_study(rng, runs=8, boards=50, effect=effect, run_sd=0.05)
    out = run_stats.paired_runs(diffs)
    per_run = np.array([d.mean() for d in diffs])
    assert out["test"] == "runs" and out["runs"] == 8 and np.allclose(out["per_run"], per_run, atol=1e-6)
    assert out["diff"] == pytest.approx(per_run.mean(), abs=1e-6)
    assert out["sd"] == pytest.approx(per_run.std(ddof=1), abs=1e-6)
    assert out["p_value"] == pytest.approx(stats.ttest_1samp(per_run, 0).pvalue, abs=1e-4)
    lo, hi = stats.t.interval(0.95, 7, loc=per_run.mean(), scale=stats.sem(per_run))
    assert out["ci95"] == pytest.approx([lo, hi], abs=1e-6)
    assert out["exact"] and out["p_exact"] == pytest.approx(enumerate_sign_flips(per_run), abs=1e-4)
    assert out["p_exact_min"] == pytest.approx(2 / 2**8)
    b_lo, b_hi = out["bootstrap_ci95"]
    assert b_lo < out["diff"] < b_hi
    if effect:  # a known effect of 0.1 against a run-to-run SD of ~0.07: found, inside every interval
        assert out["p_value"] < 0.01 and out["p_exact"] < 0.01 and lo < effect < hi and b_lo < effect < b_hi
    else:
        assert out["p_value"] > 0.05 and out["p_exact"] > 0.05 and lo < 0 < hi


def test_sign_flip_monte_carlo_beyond_sixteen_runs():
    d = np.random.default_rng(0).normal(0.1, 1.0, 20)
    p, exact = run_stats.sign_flip_p(d)
    assert not exact and p == pytest.approx(enumerate_sign_flips(d), abs=0.015)
    assert run_stats.sign_flip_p(np.zeros(5)) == (1.0, True)


def test_hierarchical_bootstrap_spread_matches_its_analytic_variance():
    """Draw n runs, then each drawn run's boards: the replicate mean has variance
    (between-run variance + mean within-run variance / boards) / n, both with ddof 0."""
    rng = np.random.default_rng(1)
    diffs = [rng.integers(-1, 2, m).astype(float) + shift for m, shift in ((60, 0.0), (80, 0.3), (40, -0.2))]
    reps = run_stats.hierarchical_bootstrap(diffs, resamples=20_000, seed=0)
    means = np.array([d.mean() for d in diffs])
    within = np.array([d.var() / len(d) for d in diffs])
    n = len(diffs)
    assert reps.mean() == pytest.approx(means.mean(), abs=0.01)
    assert reps.var() == pytest.approx((means.var() + within.mean()) / n, rel=0.05)


def test_holm():
    assert run_stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert run_stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_one_run_and_identical_runs():
    one = run_stats.paired_runs([np.array([1.0, 0.0, 0.0])])
    assert one["runs"] == 1 and one["diff"] == pytest.approx(1 / 3, abs=1e-6)
    assert one["p_value"] is None and one["ci95"] is None and "runs_needed" not in one["power"]
    same = run_stats.paired_runs([np.zeros(4), np.zeros(4), np.zeros(4)])
    assert same["p_value"] == 1.0 and same["p_exact"] == 1.0 and same["power"]["runs_for_observed"] is None


def test_false_positive_rate_across_runs_is_nominal_and_pooled_boards_are_not():
    """400 null studies (6 runs, 200 boards of greedy valid each; every training run has its own
    level): the run-level t rejects at about 5% (inside a 99.9% binomial band), the exact sign-flip
    test no more often, while McNemar over the pooled (run, board) pairs, which treats boards as
    replicates, rejects far more often (pseudo-replication)."""
    rng = np.random.default_rng(0)
    studies, runs, boards = 400, 6, 200
    t_hits = exact_hits = pooled_hits = 0
    for _ in range(studies):
        level = stats.norm.ppf(rng.uniform(0.05, 0.5, boards))  # each board's difficulty, on a probit scale
        arm = [rng.random(boards) < stats.norm.cdf(level + rng.normal(0, 0.4)) for _ in range(runs)]
        ref = [rng.random(boards) < stats.norm.cdf(level + rng.normal(0, 0.4)) for _ in range(runs)]
        out = run_stats.across_runs([np.mean(a.astype(float) - r) for a, r in zip(arm, ref)])
        t_hits += out["p_value"] < 0.05
        exact_hits += out["p_exact"] < 0.05
        pooled = benchmark.paired_change(
            {"point": "ref", "board_valid": "".join(np.where(np.concatenate(ref), "1", "0"))},
            {"board_valid": "".join(np.where(np.concatenate(arm), "1", "0"))},
        )
        pooled_hits += pooled["p_value"] < 0.05
    lo, hi = stats.binom.ppf([0.0005, 0.9995], studies, 0.05)
    assert lo <= t_hits <= hi, t_hits
    assert exact_hits <= hi, exact_hits
    assert pooled_hits > 0.3 * studies, pooled_hits


def test_power_against_a_simulation():
    sd, effect = 0.02, 0.02
    n = run_stats.runs_needed(effect, sd)
    assert run_stats.power(effect, sd, n - 1) < 0.8 <= run_stats.power(effect, sd, n)
    rng = np.random.default_rng(0)
    for runs in (3, n):
        sims = rng.normal(effect, sd, (20_000, runs))
        hit = np.mean(stats.ttest_1samp(sims, 0, axis=1).pvalue < 0.05)
        assert hit == pytest.approx(run_stats.power(effect, sd, runs), abs=0.015)
    mde = run_stats.minimal_effect(sd, 3)
    assert run_stats.power(mde, sd, 3) == pytest.approx(0.8, abs=1e-6) and run_stats.power(-mde, sd, 3) > 0.79
    summary = run_stats.power_summary(sd, 3, effects=(0.01, effect))
    assert [r["runs"] for r in summary["runs_needed"]] == [run_stats.runs_needed(0.01, sd), n]
    assert summary["sd_upper95"] == pytest.approx(sd * np.sqrt(2 / stats.chi2.ppf(0.05, 2)), rel=1e-4)
    assert summary["exact_min_runs"] == 6  # 2 / 2^6 < 0.05 <= 2 / 2^5
