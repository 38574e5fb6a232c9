"""Inference over independent training runs: the run, not the board, is the unit of replication.

    test = paired_runs([d_0, d_1, d_2])   # d_s: (m_s,) per-board differences (arm - reference) of run s
    power(0.02, sd=0.015, runs=3)         # the paired t's power to detect a 2-point difference
    runs_needed(0.02, sd=0.015)           # the fewest runs with 80% power for it
    minimal_effect(sd=0.015, runs=3)      # the smallest difference 3 runs detect with 80% power

The arms of one seed share a warm start and are scored on the same boards, so each seed gives one
paired difference per comparison: the mean over its boards of (arm - reference). Those n per-run
differences are the sample: a paired t-test across runs, an exact sign-flip permutation test
(every one of the 2^n sign patterns for n <= 16, else Monte Carlo) and a hierarchical bootstrap
interval (resample runs, then boards within each drawn run). A test that pools the (seed, board)
pairs of all runs (benchmark.paired_change, benchmark.paired_sampled_change) treats boards as
replicates: it measures evaluation noise given these runs, not the spread between training runs,
and is anti-conservative for any claim about training (tests/test_run_stats.py shows how much).
Rates are fractions throughout (0.01 = 1 point).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

ALPHA, POWER = 0.05, 0.8
EFFECTS = (0.01, 0.02, 0.05)  # the differences a study's power table is given for (1, 2, 5 points)
EXACT_MAX_RUNS = 16  # up to this many runs the sign-flip test enumerates all 2^n patterns
MONTE_CARLO = 20_000  # sign patterns drawn beyond it
BOOTSTRAP = 10_000  # hierarchical bootstrap resamples


def sign_flip_p(d: np.ndarray) -> tuple[float, bool]:
    """d: (n,) per-run differences -> (the two-sided p of their mean under random sign flips,
    whether it is exact: all 2^n patterns for n <= EXACT_MAX_RUNS, else MONTE_CARLO draws, seeded)."""
    d = np.asarray(d, np.float64)
    if np.all(d == 0):
        return 1.0, True
    exact = len(d) <= EXACT_MAX_RUNS
    res = stats.permutation_test(
        (d,),
        np.mean,
        permutation_type="samples",
        n_resamples=2 ** len(d) if exact else MONTE_CARLO,
        alternative="two-sided",
        random_state=0,
    )
    return float(res.pvalue), exact


def hierarchical_bootstrap(boards: Sequence[np.ndarray], resamples: int = BOOTSTRAP, seed: int = 0) -> np.ndarray:
    """boards: n runs' per-board differences, run s's (m_s,) -> (resamples,) bootstrap means: n runs
    drawn with replacement, each drawn run's boards redrawn with replacement (its own m_s), the
    mean over the drawn runs of each one's board mean. A run's board redraw is a multinomial over its
    distinct values, so the cost does not grow with the number of boards."""
    rng = np.random.default_rng(seed)
    n = len(boards)
    pick = rng.integers(0, n, (resamples, n))
    means = np.empty((resamples, n))
    for s, d in enumerate(boards):
        d = np.asarray(d, np.float64)
        values, counts = np.unique(d, return_counts=True)
        where = pick == s
        means[where] = rng.multinomial(len(d), counts / len(d), size=int(where.sum())) @ values / len(d)
    return means.mean(axis=1)


def power(effect, sd: float, runs, alpha: float = ALPHA):
    """The two-sided paired t-test's power over `runs` runs (>= 2; scalar or array) when the runs'
    differences have mean `effect` and SD `sd` (> 0): P(|T| > t_crit) with T noncentral t, n - 1
    degrees of freedom, noncentrality |effect| / (sd / sqrt(n)). (scipy's nct.cdf is NaN far in the
    lower tail, where the wrong-sign rejection it measures is ~0.)"""
    runs = np.asarray(runs, np.float64)
    df = runs - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = np.abs(np.asarray(effect, np.float64)) / sd * np.sqrt(runs)
    return stats.nct.sf(crit, df, nc) + np.nan_to_num(stats.nct.cdf(-crit, df, nc), nan=0.0)


def runs_needed(effect: float, sd: float, target: float = POWER, alpha: float = ALPHA) -> int | None:
    """The fewest runs (>= 2) whose paired t-test detects a true difference `effect` with power
    `target`, given the runs' SD `sd` (> 0); None for no difference. The search starts at the
    z-test's count, which the t-test never beats, and walks up 64 runs at a time."""
    if effect == 0:
        return None
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(target)
    start = max(2, int((z * sd / abs(effect)) ** 2))
    while True:
        n = np.arange(start, start + 64)
        ok = np.flatnonzero(power(effect, sd, n, alpha) >= target)
        if ok.size:
            return int(n[ok[0]])
        start += 64


def minimal_effect(sd: float, runs: int, target: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest true difference that `runs` (>= 2) runs detect with power `target` by the paired
    t-test, given the runs' SD `sd` (> 0)."""
    hi = sd
    while power(hi, sd, runs, alpha) < target:
        hi *= 2
    return float(optimize.brentq(lambda e: power(e, sd, runs, alpha) - target, 0.0, hi, xtol=1e-9))


def power_summary(sd: float | None, runs: int, effects: Sequence[float] = EFFECTS) -> dict:
    """The study's power from the observed SD of the per-run differences: {"sd", "sd_upper95" (its
    one-sided 95% upper bound, chi-square with n - 1 df), "alpha", "power", "runs_needed": [{"effect",
    "runs"}], "minimal_effect" (at the current runs), "exact_min_runs" (the
    fewest runs whose sign-flip test can reach p < alpha at all: 2 / 2^n <= alpha)}. With fewer than
    two runs or no spread, only the last."""
    out = {"alpha": ALPHA, "power": POWER, "exact_min_runs": int(np.ceil(np.log2(2 / ALPHA)))}
    if sd is None or runs < 2 or sd <= 0:
        return out
    upper = sd * np.sqrt((runs - 1) / stats.chi2.ppf(ALPHA, runs - 1))
    return {
        "sd": round(sd, 6),
        "sd_upper95": round(float(upper), 6),
        **out,
        "runs_needed": [{"effect": e, "runs": runs_needed(e, sd)} for e in effects],
        "minimal_effect": round(minimal_effect(sd, runs), 6),
    }


def holm(p: Sequence[float]) -> np.ndarray:
    """p: (k,) p-values of one family of tests -> (k,) Holm-Bonferroni adjusted p-values (the i-th
    smallest times k - i, made monotone, at most 1): reject where adjusted p < alpha keeps the
    family-wise error rate at alpha."""
    p = np.asarray(p, np.float64)
    order = np.argsort(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (len(p) - np.arange(len(p)))))
    out = np.empty_like(p)
    out[order] = adjusted
    return out


def across_runs(per_run: np.ndarray) -> dict:
    """per_run: (n,) per-run differences -> the tests across runs: {"test": "runs", "runs": n,
    "per_run", "diff": their mean, "sd": their SD, "ci95": 95% t-interval, "p_value": paired t
    (one-sample t of the differences), "p_exact": sign-flip permutation p, "exact": whether all
    2^n patterns were enumerated, "p_exact_min": the smallest p the sign-flip test can give (2 /
    2^n)}. With one run the tests, the interval and the SD are None."""
    per_run = np.asarray(per_run, np.float64)
    n, diff = len(per_run), float(per_run.mean())
    out = {"test": "runs", "runs": n, "per_run": [round(float(x), 6) for x in per_run], "diff": round(diff, 6)}
    if n < 2:
        return {**out, "sd": None, "ci95": None, "p_value": None, "p_exact": None, "exact": None, "p_exact_min": 1.0}
    sd = float(per_run.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n))
    if sd > 0:
        p = float(stats.ttest_1samp(per_run, 0.0).pvalue)
    else:  # every run gave the same difference: no spread to test against
        p = 1.0 if diff == 0 else 0.0
    p_exact, exact = sign_flip_p(per_run)
    return {
        **out,
        "sd": round(sd, 6),
        "ci95": [round(diff - half, 6), round(diff + half, 6)],
        "p_value": round(p, 4),
        "p_exact": round(p_exact, 4),
        "exact": exact,
        "p_exact_min": 2.0 ** (1 - n) if exact else 1 / (MONTE_CARLO + 1),
    }


def paired_runs(boards: Sequence[np.ndarray], effects: Sequence[float] = EFFECTS, resamples: int = BOOTSTRAP) -> dict:
    """boards: n runs' per-board differences (arm - reference, the same boards within a run), run s's
    (m_s,) -> the run-level test of their board means: across_runs, with "bootstrap_ci95" (the
    hierarchical bootstrap's percentile interval) and "power" (power_summary, with
    "runs_for_observed": the runs whose paired t detects a true difference of the observed size
    with 80% power). With one run the interval is None and the power has no figures."""
    out = across_runs(np.array([np.mean(np.asarray(d, np.float64)) for d in boards]))
    sd, diff = out["sd"] or 0.0, out["diff"]
    boot = np.percentile(hierarchical_bootstrap(boards, resamples), [2.5, 97.5]) if out["runs"] > 1 else None
    return {
        **out,
        "bootstrap_ci95": None if boot is None else [round(float(boot[0]), 6), round(float(boot[1]), 6)],
        "power": {
            **power_summary(out["sd"], out["runs"], effects),
            "runs_for_observed": runs_needed(diff, sd) if sd > 0 else None,
        },
    }
