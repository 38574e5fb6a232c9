"""A study: arms (config overrides) x seeds of the stage loop, and what they show together.

    arms = parse_arms("grpo,shuffle,fixed,lr3e-4:optim.learning_rate=3e-4+grpo.steps=32")
    summary = summarize(results, reference="grpo")   # results[arm][seed] = a run's results.json
    write_study(directory, summary)                  # study.{md,csv,json,png}, study_curves.png
    results = collect(["runs/study_s0", "runs/study_s1"])  # finished studies' runs, merged

Every arm of one seed starts from the same warm start (launch/study.py runs it once and copies
it), so the arms of a seed are one training run each, scored on the same boards. Two kinds of
test, named in the summary's "tests":

- across runs (PRIMARY, `runs_vs_warm`, `vs_reference.runs`; run_stats.paired_runs): each seed
  gives one difference per comparison, the mean over its boards of (arm - reference); the n
  differences get a paired t-test (also Holm-adjusted over all the study's run-level tests), an
  exact sign-flip permutation test and a hierarchical bootstrap interval, with the power of the
  design (runs needed for 80% power at 1, 2, 5 points,
  and the smallest difference the current runs detect). This is the test of a training effect.
- evaluation noise given the runs (secondary, `monitor_vs_warm`, `benchmark_vs_warm`,
  `vs_reference.pooled`, and per seed): the monitor's avg@k by a paired permutation test over
  boards (`benchmark.paired_sampled_change`), the benchmark's greedy valid rate by the exact
  McNemar test (`benchmark.paired_change`), per seed and pooled over the (seed, board) pairs of
  all seeds. Boards are the replicates here, so these say whether these trained models differ on
  these boards, not whether new training runs would: for a training claim they are
  pseudo-replicated.

Across seeds, each level is the mean with a 95% t-interval over the seeds (wide with three:
t = 4.30).
"""

from __future__ import annotations

import csv
import io as _io
import json
import os
from math import comb

import numpy as np

from t2t_jax.env import io
from t2t_jax.evaluation import benchmark, run_stats

# What each test of the summary is, written into study.json ("tests").
TESTS = {
    "runs": {
        "role": "primary: inference over independent training runs (one per seed)",
        "fields": ["arms.ARM.runs_vs_warm", "arms.ARM.vs_reference.runs"],
        "what": "per run the mean over its boards of (arm - reference) on the same boards; across the runs a "
        "paired t-test (p_value, ci95; p_holm: Holm-adjusted over every run-level test of the study), an exact "
        "sign-flip permutation test (p_exact; all 2^n patterns for n <= 16, else Monte Carlo) and a "
        "hierarchical bootstrap 95% interval (bootstrap_ci95: runs, then boards within runs); power: from the "
        "SD of the per-run differences, the runs needed for 80% power "
        "at alpha 0.05 (paired t, noncentral t) and the smallest difference the current runs detect",
    },
    "pooled": {
        "role": "secondary: evaluation noise given the runs",
        "fields": ["arms.ARM.monitor_vs_warm", "arms.ARM.benchmark_vs_warm", "arms.ARM.vs_reference.pooled"],
        "what": "paired tests over the (seed, board) pairs of all seeds (monitor: paired permutation; benchmark: "
        "exact McNemar); boards are the replicates, so they measure evaluation noise around these training "
        "runs, not the spread between training runs",
    },
    "per_seed": {
        "role": "secondary: evaluation noise of one run",
        "fields": ["arms.ARM.per_seed.S", "arms.ARM.vs_reference.per_seed.S"],
        "what": "the same board-level tests within one seed",
    },
}

# The avg@k metrics of a point beside the benchmark: the monitor (env.initial) and the target (eval.target).
SAMPLED = ("monitor", "target")

# Named arms: the stage-loop config overrides each stands for.
ARMS = {
    "grpo": (),
    "shuffle": ("grpo.control=shuffle",),
    "replay": ("engineer.kind=fixed", "grpo.replay=0.5"),  # PLR / SFL-style replay of learnable boards
    **{
        kind: (f"engineer.kind={kind}",)
        for kind in ("self", "fixed", "random", "frontier", "learnability", "uniform", "scripted", "scripted_rewrite")
    },
}


def parse_arms(spec: str) -> dict[str, tuple[str, ...]]:
    """ "grpo,shuffle,name:key=value+key=value" -> {name: overrides}; a bare name must be one of
    ARMS, a custom arm gives its overrides (`config.` is implied) after a colon, joined by `+`."""
    arms: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, rest = item.partition(":")
        if rest:
            overrides = tuple(o.strip() for o in rest.split("+"))
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ValueError(f"--arms: {item!r}: overrides are key=value joined by '+', got {bad}")
        elif name in ARMS:
            overrides = ARMS[name]
        else:
            raise ValueError(f"--arms: {name!r} is not one of {sorted(ARMS)} (or give name:key=value+...)")
        if not name.replace("_", "").replace("-", "").isalnum() or name == "warm_start":
            raise ValueError(f"--arms: {name!r} must be letters, digits, '_' or '-' (and not warm_start)")
        if name in arms:
            raise ValueError(f"--arms: {name!r} appears twice")
        arms[name] = overrides
    if not arms:
        raise ValueError("--arms: no arm given")
    return arms


def run_name(seed: int, grpo_seed: int | None = None) -> str:
    """A run's directory under DIR/ARM: `seed_S`, or `seed_S_grpo_G` for GRPO seed G of seed S's
    warm start (launch.study --grpo_seeds)."""
    return f"seed_{seed}" if grpo_seed is None else f"seed_{seed}_grpo_{grpo_seed}"


def run_key(seed: int, grpo_seed: int | None = None) -> int | str:
    """A run's key in results[arm]: the seed, or "S.G" for GRPO seed G of seed S's warm start."""
    return seed if grpo_seed is None else f"{seed}.{grpo_seed}"


def parse_run_name(name: str) -> int | str | None:
    """`run_name`'s inverse as a `run_key` (None for any other name)."""
    parts = name.split("_")
    if parts[0] != "seed" or not all(p.isdigit() for p in parts[1::2]):
        return None
    if len(parts) == 2:
        return run_key(int(parts[1]))
    if len(parts) == 4 and parts[2] == "grpo":
        return run_key(int(parts[1]), int(parts[3]))
    return None


def run_order(keys) -> list:
    """Run keys in order: by seed, then GRPO seed."""
    return sorted(keys, key=lambda k: tuple(int(x) for x in str(k).split(".")))


def finished(workdir: str) -> bool:
    """A run is finished when its results.json ends with the last stage of its config (config.json
    with its resumes' changes)."""
    from t2t_jax import rundir

    try:
        stages = rundir.current_config(workdir)["stages"]
        with open(os.path.join(workdir, "results.json")) as f:
            points = [r["point"] for r in json.load(f)]
    except (OSError, ValueError, KeyError, rundir.RunDirError):
        return False
    return len(points) == stages + 1 and (stages == 0 or points[-1] == f"stage_{stages - 1}")


def collect(directories: list[str]) -> dict:
    """results[arm][seed] from the finished runs under study directories (each
    DIR/ARM/seed_S/results.json, the layout launch.study writes; a run whose config.json says it
    has stages still to run is left out), for a report over seeds run in different studies.

    Raises ValueError when a (arm, seed) is found twice, or when the arms of one seed did not
    start from the same warm start (different first-point boards: the seed was run twice, on
    different machines or code, so its arms cannot be paired)."""
    results: dict = {}
    where: dict = {}
    for directory in directories:
        if not os.path.isdir(directory):
            raise ValueError(f"--merge: {directory!r} is not a directory")
        for arm in sorted(os.listdir(directory)):
            if arm == "warm_start" or not os.path.isdir(os.path.join(directory, arm)):
                continue
            for name in sorted(os.listdir(os.path.join(directory, arm))):
                run = os.path.join(directory, arm, name)
                path = os.path.join(run, "results.json")
                seed = parse_run_name(name)
                if seed is None or not os.path.isfile(path):
                    continue
                if os.path.isfile(os.path.join(run, "config.json")) and not finished(run):
                    continue  # a run still going (or stopped part-way): its last point is not the end
                if seed in results.get(arm, {}):
                    raise ValueError(f"--merge: arm {arm!r} seed {seed} is in both {where[arm, seed]} and {path}")
                with open(path) as f:
                    results.setdefault(arm, {})[seed] = json.load(f)
                where[arm, seed] = path
    if not results:
        raise ValueError(f"--merge: no ARM/seed_S/results.json under {directories}")
    for seed in run_order({s for by_seed in results.values() for s in by_seed}):
        starts = {arm: by_seed[seed][0]["board_valid"] for arm, by_seed in results.items() if seed in by_seed}
        if len(set(starts.values())) > 1:
            first = next(iter(starts))
            other = next(a for a in starts if starts[a] != starts[first])
            raise ValueError(
                f"--merge: seed {seed}: arms {first!r} ({where[first, seed]}) and {other!r} "
                f"({where[other, seed]}) start from different warm starts; they cannot be paired"
            )
    return results


def complete_arms(results: dict, reference: str) -> tuple[dict, list[str]]:
    """(the arms that hold every seed of the reference arm, the reference first and the named arms
    in ARMS order; the names of the arms that do not)."""
    seeds = set(results[reference])
    order = sorted(results, key=lambda a: (a != reference, list(ARMS).index(a) if a in ARMS else len(ARMS), a))
    keep = {arm: {s: results[arm][s] for s in run_order(seeds)} for arm in order if seeds <= set(results[arm])}
    return keep, sorted(set(results) - set(keep))


def _interval(values) -> dict:
    """mean and 95% t-interval over seeds (the interval is the mean alone for one seed)."""
    from scipy.stats import t

    v = np.asarray(values, np.float64)
    half = float(t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
    m = float(v.mean())
    return {"mean": round(m, 4), "ci95": [round(m - half, 4), round(m + half, 4)], "seeds": len(v)}


def _pooled(entries_a: list[dict], entries_b: list[dict]) -> dict:
    """Paired tests over the (seed, board) pairs of all seeds: monitor avg@k and benchmark greedy."""
    out = {}
    for metric in sampled_metrics(entries_a + entries_b):

        def cat(es):
            return {
                "k": es[0][metric]["k"],
                "point": es[0]["point"],
                "board_valid_counts": sum((e[metric]["board_valid_counts"] for e in es), []),
            }

        out[metric] = benchmark.paired_sampled_change(cat(entries_a), cat(entries_b))
    out["benchmark"] = benchmark.paired_change(
        {"point": entries_a[0]["point"], "board_valid": "".join(e["board_valid"] for e in entries_a)},
        {"board_valid": "".join(e["board_valid"] for e in entries_b)},
    )
    return out


def _board_diffs(entries_a: list[dict], entries_b: list[dict]) -> dict[str, list[np.ndarray]]:
    """Per run (seed) the per-board differences b - a on the same boards: {"monitor", "target": n
    arrays (m,) of avg@k valid (when every entry has it), "benchmark": n arrays (m,) of greedy valid}."""
    out = {}
    for metric in sampled_metrics(entries_a + entries_b):
        out[metric] = [
            (np.asarray(b[metric]["board_valid_counts"]) - np.asarray(a[metric]["board_valid_counts"])) / b[metric]["k"]
            for a, b in zip(entries_a, entries_b)
        ]
    out["benchmark"] = [
        np.array([int(y) - int(x) for x, y in zip(a["board_valid"], b["board_valid"])], np.float64)
        for a, b in zip(entries_a, entries_b)
    ]
    return out


def sampled_metrics(entries: list[dict]) -> list[str]:
    """The avg@k metrics every entry holds: "monitor" (env.initial) and "target" (eval.target)."""
    return [m for m in SAMPLED if all(m in e for e in entries)]


def mechanism(by_seed: dict) -> dict | None:
    """An arm's GRPO signal over its runs: per run the mean over its stages of the share of
    informative groups (groups whose accuracy differs, the only ones with an advantage) and of the
    samples drawn per step (the points' `grpo`, stages.grpo_summary); None for runs that predate it."""
    runs = []
    for points in by_seed.values():
        stages = [p["grpo"] for p in points if (p.get("grpo") or {}).get("informative_groups") is not None]
        if not stages:
            return None
        runs.append(stages)
    shares = [[g["informative_groups"] for g in st] for st in runs]  # [runs][stages]
    return {
        "informative_groups": _interval([np.mean(x) for x in shares]),
        "per_stage": [round(float(np.mean(x)), 4) for x in zip(*shares)],
        "samples_per_step": _interval([np.mean([g["samples_per_step"] for g in st]) for st in runs]),
        "no_signal_steps": _interval([sum(g["no_signal"] for g in st) for st in runs]),
    }


def curves(by_seed: dict, seeds: list, reference: dict | None = None) -> dict:
    """Per sampled metric (monitor, target) at every evaluation point the runs share: the point's
    name, the level (mean and 95% t-interval over runs) and, given the reference arm's runs
    (`reference[seed]`), the run-paired difference arm - reference the same way."""
    n = min(len(by_seed[s]) for s in seeds)
    out = {}
    for metric in sampled_metrics([by_seed[s][i] for s in seeds for i in range(n)]):
        level = [[by_seed[s][i][metric]["avg_valid"] for s in seeds] for i in range(n)]
        out[metric] = {
            "points": [by_seed[seeds[0]][i].get("point", str(i)) for i in range(n)],
            "level": [_interval(v) for v in level],
        }
        if reference is not None and min(len(reference[s]) for s in seeds) >= n:
            ref = [[reference[s][i][metric]["avg_valid"] for s in seeds] for i in range(n)]
            out[metric]["vs_reference"] = [_interval(np.subtract(a, b)) for a, b in zip(level, ref)]
    return out


def _runs(entries_a: list[dict], entries_b: list[dict], effects) -> dict:
    """The run-level tests (run_stats.paired_runs) of b - a, one run per entry, per metric."""
    return {m: run_stats.paired_runs(d, effects) for m, d in _board_diffs(entries_a, entries_b).items()}


def summarize(results: dict, reference: str, effects=run_stats.EFFECTS) -> dict:
    """results[arm][seed] = a finished run's results (launch.main's results.json: the warm start
    first, the last stage last) -> the study's summary (see the module docstring); `effects`
    (fractions) are the differences of the power table."""
    if reference not in results:
        raise ValueError(f"--reference: {reference!r} is not one of the arms {sorted(results)}")
    seeds = run_order(results[reference])
    arms = {}
    for arm, by_seed in results.items():
        if run_order(by_seed) != seeds:
            raise ValueError(f"arm {arm!r} has seeds {run_order(by_seed)}, the reference {seeds}")
        last = [by_seed[s][-1] for s in seeds]
        first = [by_seed[s][0] for s in seeds]
        vs_warm = _pooled(first, last)
        row = {
            "seeds": seeds,
            "runs_vs_warm": _runs(first, last, effects),
            "per_seed": {},
            "benchmark_valid": _interval([e["valid"] for e in last]),
            "benchmark_optimal": _interval([e["optimal"] for e in last]),
            "benchmark_vs_warm": vs_warm["benchmark"],
        }
        for metric in sampled_metrics(first + last):
            row[f"{metric}_avg_valid"] = _interval([e[metric]["avg_valid"] for e in last])
            row[f"{metric}_gain"] = _interval(
                [e[metric]["avg_valid"] - f[metric]["avg_valid"] for e, f in zip(last, first)]
            )
            row[f"{metric}_vs_warm"] = vs_warm[metric]
        row["mechanism"] = mechanism(by_seed)
        row["curves"] = curves(by_seed, seeds, results[reference] if arm != reference else None)
        for s, e, f in zip(seeds, last, first):
            seed_row = {
                "warm_valid": f["valid"],
                "valid": e["valid"],
                "optimal": e["optimal"],
                "vs_warm": e.get("vs_first"),
            }
            for metric in sampled_metrics([e, f]):
                seed_row.update(
                    {
                        f"warm_{metric}": f[metric]["avg_valid"],
                        metric: e[metric]["avg_valid"],
                        f"{metric}_vs_warm": e.get(f"{metric}_vs_first"),
                    }
                )
            row["per_seed"][str(s)] = seed_row
        if arm != reference:
            ref_last = [results[reference][s][-1] for s in seeds]
            row["vs_reference"] = {
                "runs": _runs(ref_last, last, effects),
                "pooled": _pooled(ref_last, last),
                "per_seed": {str(s): _pooled([r], [e]) for s, r, e in zip(seeds, ref_last, last)},
            }
        arms[arm] = row
    ends = [results[reference][s][-1] for s in seeds]
    k, target_k = (next((e[m]["k"] for e in ends if m in e), None) for m in SAMPLED)
    summary = {"reference": reference, "seeds": seeds, "monitor_k": k, "tests": TESTS, "arms": arms}
    if target_k is not None:
        summary["target_k"] = target_k
    family = [t for _, _, _, t, _ in comparisons(summary) if t["p_value"] is not None]
    for t, p in zip(family, run_stats.holm([t["p_value"] for t in family])):
        t["p_holm"] = round(float(p), 4)  # the paired t, Holm-adjusted over every run-level test here
    return summary


def _fmt(i: dict, scale: float = 100.0) -> str:
    return f"{scale * i['mean']:.2f} [{scale * i['ci95'][0]:.2f}, {scale * i['ci95'][1]:.2f}]"


def _test(d: dict) -> str:
    return f"{100 * d['diff']:+.2f} [{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}], p = {d['p_value']:.4f}"


def _pts(x: float) -> str:
    return f"{100 * x:+.2f}"


def _span(ci) -> str:
    return f"[{_pts(ci[0])}, {_pts(ci[1])}]" if ci else "–"


def comparisons(summary: dict) -> list[tuple[str, str, str, dict, dict | None]]:
    """Every comparison of the study, run-level test first: (arm, against ("warm start" or the
    reference), metric ("monitor", "target" or "benchmark"), the run-level test (run_stats.paired_runs), the
    board-pooled test or None); each arm against its warm start, then each other arm against the
    reference."""
    ref, arms = summary["reference"], summary["arms"]
    out = []
    for arm, r in arms.items():
        for metric, runs in r["runs_vs_warm"].items():
            out.append((arm, "warm start", metric, runs, r.get(f"{metric}_vs_warm")))
    for arm, r in arms.items():
        if "vs_reference" in r:
            v = r["vs_reference"]
            for metric, runs in v["runs"].items():
                out.append((arm, ref, metric, runs, v["pooled"].get(metric)))
    return out


def _verdict(arm: str, against: str, metric: str, t: dict) -> str:
    """One plain sentence on a run-level test: significant or not, and what a null rules out."""
    n, pw = t["runs"], t["power"]
    head = (
        f"- `{arm}` vs {against}, {metric}: {_pts(t['diff'])} points (per run "
        f"{', '.join(_pts(x) for x in t['per_run'])}), paired t p = {t['p_value']:.4f}, exact sign-flip "
        f"p = {t['p_exact']:.4f}, 95% t-interval {_span(t['ci95'])}, bootstrap {_span(t['bootstrap_ci95'])}"
    )
    if t["p_value"] < run_stats.ALPHA:
        caveats = [] if t["p_holm"] < run_stats.ALPHA else [f"not after Holm's correction (p = {t['p_holm']:.4f})"]
        if t["p_exact"] >= run_stats.ALPHA:
            caveats.append("not by the exact test")
        return (
            head + ": **significant across runs** by the paired t" + (f", {' and '.join(caveats)}." if caveats else ".")
        )
    if "minimal_effect" not in pw:
        return head + ": not significant (the runs gave identical differences)."
    observed = pw["runs_for_observed"]
    return (
        head + f": **not significant**. With {n} runs and a run-to-run SD of {100 * pw['sd']:.2f} points only "
        f"differences of {100 * pw['minimal_effect']:.2f} points or more are detected with 80% power: the null "
        "says nothing about smaller ones."
        + (f" A true difference of the observed size needs {observed} runs." if observed else "")
    )


def study_markdown(summary: dict, command: str = "") -> str:
    """The study as a Markdown report: the run-level tests of every comparison (primary) with the
    study's power and a plain verdict on each; the means over seeds; the board-pooled and per-seed
    tests (evaluation noise given the runs); the list of what the pooled tests call significant."""
    ref, k, arms, seeds = summary["reference"], summary["monitor_k"], summary["arms"], summary["seeds"]
    n = len(seeds)
    every = comparisons(summary)
    lines = ["# Study", ""]
    if command:
        lines += ["```", command, "```", ""]
    lines += [
        f"Seeds {seeds}: {n} independent training run{'s' if n > 1 else ''} per arm (the arms of a seed share "
        f"its warm start and are scored on the same boards); reference arm `{ref}`; monitor: avg@{k} valid; "
        "benchmark: greedy valid. Figures in points (%).",
        "",
        "**Which test is which.** The primary test of every comparison is across training runs: each run "
        "(seed) gives one difference, the mean over its boards of (arm - reference), and the n differences "
        "get a paired t-test (p, 95% t-interval), an exact sign-flip permutation test (every sign pattern "
        "of the n runs) and a hierarchical bootstrap 95% interval (runs resampled, then boards within each "
        "run). The board-pooled tests further down treat the (seed, board) pairs as replicates: they measure "
        "**evaluation noise given the runs** (would these trained models differ again on new boards?), not "
        "whether new training runs would reproduce the difference, and are secondary.",
        "",
        "## Across runs (primary)",
        "",
    ]
    if any("." in str(x) for x in seeds):
        lines += [
            "Runs `S.G`: GRPO seed G (`grpo_seed`) from seed S's warm start. Runs of one warm start share it, so "
            "their spread is the GRPO phase's given that warm start; the warm start's own variance is the factor S.",
            "",
        ]
    if n < 2:
        lines += ["One run per arm: no test across runs is possible; every test below is evaluation noise.", ""]
    lines += [
        "| arm | vs | metric | per-run differences | mean | 95% t-interval | p (paired t) | p (t, Holm) | "
        "p (exact sign-flip) | hierarchical bootstrap 95% |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, against, metric, t, _ in every:
        tests = (
            [
                _span(t["ci95"]),
                f"{t['p_value']:.4f}",
                f"{t['p_holm']:.4f}",
                f"{t['p_exact']:.4f}",
                _span(t["bootstrap_ci95"]),
            ]
            if t["p_value"] is not None
            else ["–"] * 5
        )
        cells = [arm, against, metric, ", ".join(_pts(x) for x in t["per_run"]), _pts(t["diff"]), *tests]
        lines.append("| " + " | ".join(cells) + " |")
    if n >= 2:
        first = every[0][3]
        effects = [e["effect"] for e in first["power"].get("runs_needed", [])] or list(run_stats.EFFECTS)
        lines += ["", "### What the runs show", ""]
        lines += [_verdict(arm, against, metric, t) for arm, against, metric, t, _ in every]
        tested = sum(t["p_value"] is not None for _, _, _, t, _ in every)
        lines.append(
            f"- {tested} run-level tests at p < {run_stats.ALPHA}: if no arm differed, about "
            f"{tested * run_stats.ALPHA:.1f} would be significant by chance (Holm's correction keeps that to 5% "
            "for the whole family)."
        )
        lines.append(
            f"- The hierarchical bootstrap interval understates the spread with few runs: it treats the {n} runs as "
            f"the whole population of runs (its between-run variance is (n-1)/n of the sample's, {n} runs have "
            f"{comb(2 * n - 1, n)} distinct resamples); the t-interval is the one to read."
        )
        exact_min = first["power"]["exact_min_runs"]
        if n < exact_min:
            lines += [
                f"- With {n} runs the exact sign-flip test cannot reach p < {run_stats.ALPHA} (its smallest p is "
                f"2/2^{n} = {first['p_exact_min']:.4f}; it needs {exact_min} runs), and the t-test's p rests on the "
                f"per-run differences being normal, which {n} runs cannot check.",
            ]
        lines += [
            "",
            "### Power",
            "",
            f"From the SD of each comparison's per-run differences: the runs a paired t-test needs for 80% "
            f"power at alpha {run_stats.ALPHA} (noncentral t), and the smallest true difference the current "
            f"{n} runs detect with 80% power. The SD has {n - 1} degree{'s' if n > 2 else ''} of freedom; at its "
            "one-sided 95% upper bound (in brackets) every figure is worse.",
            "",
            "| arm | vs | metric | SD over runs [95% upper] | runs for 80% power at "
            + " / ".join(f"{100 * e:g}" for e in effects)
            + f" points | runs for the observed difference | detectable with {n} runs |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm, against, metric, t, _ in every:
            pw = t["power"]
            if "sd" not in pw:
                lines.append(f"| {arm} | {against} | {metric} | 0 (identical runs) | – | – | – |")
                continue
            need = " / ".join(str(x["runs"]) if x["runs"] else ">10^6" for x in pw["runs_needed"])
            lines.append(
                f"| {arm} | {against} | {metric} | {100 * pw['sd']:.2f} [{100 * pw['sd_upper95']:.2f}] | {need} | "
                f"{pw['runs_for_observed'] or '–'} | {100 * pw['minimal_effect']:.2f} |"
            )
    lines += [
        "",
        "## Levels (means over seeds)",
        "",
        "Mean over seeds [95% t-interval over seeds]; the pooled paired column is evaluation noise given the runs.",
        "",
        f"| arm | monitor avg@{k} valid | monitor gain vs warm start | pooled boards vs warm start (monitor) | "
        "benchmark valid | pooled boards vs warm start (benchmark) |",
        "|---|---|---|---|---|---|",
    ]
    for arm, r in arms.items():
        mon = (
            [_fmt(r["monitor_avg_valid"]), _fmt(r["monitor_gain"]), _test(r["monitor_vs_warm"])]
            if "monitor_avg_valid" in r
            else ["–"] * 3
        )
        lines.append(
            f"| {arm} | " + " | ".join(mon + [_fmt(r["benchmark_valid"]), _test(r["benchmark_vs_warm"])]) + " |"
        )
    if any("target_avg_valid" in r for r in arms.values()):
        lines += [
            "",
            f"The target (eval.target: a distribution no arm trains on), avg@{summary.get('target_k')} valid:",
            "",
            "| arm | target avg valid | target gain vs warm start | pooled boards vs warm start (target) |",
            "|---|---|---|---|",
        ]
        for arm, r in arms.items():
            if "target_avg_valid" in r:
                cells = [_fmt(r["target_avg_valid"]), _fmt(r["target_gain"]), _test(r["target_vs_warm"])]
                lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    if any(r.get("mechanism") for r in arms.values()):
        lines += [
            "",
            "## Mechanism: the GRPO signal each arm gave",
            "",
            "Per run the mean over its stages of the share of informative groups (groups whose accuracy "
            "differs: the only ones with a non-zero advantage) and of the samples drawn per step (dynamic "
            "sampling's rollout cost); mean over runs [95% t-interval over runs]; then the share per stage "
            "(mean over runs). A curriculum helps GRPO by keeping this share high.",
            "",
            "| arm | informative groups (%) | per stage (%) | samples per step | steps without an update |",
            "|---|---|---|---|---|",
        ]
        for arm, r in arms.items():
            m = r.get("mechanism")
            if not m:
                continue
            per_stage = ", ".join(f"{100 * x:.0f}" for x in m["per_stage"])
            no_signal = m["no_signal_steps"]
            lines.append(
                f"| {arm} | {_fmt(m['informative_groups'])} | {per_stage} | {_fmt(m['samples_per_step'], 1.0)} | "
                f"{_fmt(no_signal, 1.0)} |"
            )
    if any(r.get("curves") for r in arms.values()):
        lines += [
            "",
            "## Over the evaluation points",
            "",
            "`study_curves.png`: each arm's monitor and target at every evaluation point (warm start, then "
            "after each stage), the mean over runs with its 95% t-interval over runs, and beside it each "
            f"arm's run-paired difference from `{ref}` the same way.",
        ]
    lines += [
        "",
        "## Evaluation noise given the runs (secondary): board-pooled and per-seed paired tests",
        "",
        "Paired differences [95% interval over boards], p from the paired test over boards (monitor: "
        "paired permutation; benchmark: exact McNemar), pooled over the (seed, board) pairs of all seeds, then "
        "per seed. Boards are the replicates: these say whether these trained models differ on these boards, "
        "not whether new training runs would.",
        "",
        f"Against the reference arm `{ref}` (other minus reference):",
        "",
        "| arm | monitor (pooled boards) | benchmark (pooled boards) | monitor per seed | benchmark per seed |",
        "|---|---|---|---|---|",
    ]
    for arm, r in arms.items():
        if "vs_reference" not in r:
            continue
        v = r["vs_reference"]
        per_mon = "; ".join(f"s{s}: {_test(x['monitor'])}" for s, x in v["per_seed"].items() if "monitor" in x)
        per_bench = "; ".join(f"s{s}: {_test(x['benchmark'])}" for s, x in v["per_seed"].items())
        lines.append(
            f"| {arm} | {_test(v['pooled']['monitor']) if 'monitor' in v['pooled'] else '–'} | "
            f"{_test(v['pooled']['benchmark'])} | {per_mon} | {per_bench} |"
        )
    lines += [
        "",
        "Per seed (warm start -> end, %; p over the seed's boards):",
        "",
        "| arm | seed | monitor | monitor p | benchmark | benchmark p |",
        "|---|---|---|---|---|---|",
    ]
    for arm, r in arms.items():
        for s, x in r["per_seed"].items():
            mon = (
                (f"{100 * x['warm_monitor']:.2f} -> {100 * x['monitor']:.2f}", f"{x['monitor_vs_warm']['p_value']:.4f}")
                if "monitor" in x and x.get("monitor_vs_warm")
                else ("–", "–")
            )
            bench_p = f"{x['vs_warm']['p_value']:.4f}" if x.get("vs_warm") else "–"
            lines.append(
                f"| {arm} | {s} | {mon[0]} | {mon[1]} | {100 * x['warm_valid']:.2f} -> "
                f"{100 * x['valid']:.2f} | {bench_p} |"
            )
    lines += [
        "",
        "## Significant at p < 0.01 (pooled paired tests: evaluation noise given the runs)",
        "",
        "Not evidence across training runs: for that, the run-level tests above.",
        "",
    ]
    found = [
        f"- `{arm}`: {metric} vs {against} {_test(d)}"
        for arm, against, metric, _, d in every
        if d and d["p_value"] < 0.01
    ]
    lines += found or ["- nothing"]
    return "\n".join(lines) + "\n"


def forest_panels(summary: dict) -> list[tuple[str, list[tuple], float]]:
    """Forest-plot panels (t2t_jax/render/forest.py), (title, rows, alpha): first the run-level
    tests (mean of the per-run differences, 95% t-interval over runs, paired t p, dark at p < 0.05;
    the exact sign-flip p in the note), then the board-pooled tests (evaluation noise given the
    runs, dark at p < 0.01); each arm against the warm start, then each other arm against the
    reference, monitor, target (when scored) and benchmark. Run-level panels are left out with one run."""
    ref, k, n = summary["reference"], summary["monitor_k"], len(summary["seeds"])
    names = {
        "monitor": f"monitor avg@{k} valid",
        "target": f"target avg@{summary.get('target_k')} valid",
        "benchmark": "benchmark greedy valid",
    }
    panels = []
    for kind in ("runs", "pooled"):
        for against in ("warm start", ref):
            for metric in names:
                rows = []
                for arm, vs, m, t, pooled in comparisons(summary):
                    if (vs, m) != (against, metric):
                        continue
                    if kind == "runs" and t["p_value"] is not None:
                        note = f"{_pts(t['diff'])}  t p={t['p_value']:.3f}  exact p={t['p_exact']:.2f}"
                        rows.append((arm, t["diff"], *t["ci95"], t["p_value"], note))
                    elif kind == "pooled" and pooled:
                        rows.append((arm, pooled["diff"], *pooled["ci95"], pooled["p_value"]))
                title = (
                    f"across {n} runs: {names[metric]} vs {against}"
                    if kind == "runs"
                    else f"eval noise, pooled boards: {names[metric]} vs {against}"
                )
                if rows:
                    panels.append((title, rows, run_stats.ALPHA if kind == "runs" else 0.01))
    return panels


def write_study(directory: str, summary: dict, command: str = "") -> dict:
    """study.json (the summary), study.csv (arm x seed rows, with each run's difference from the
    reference run of its seed), study.md, study.png (the forest plot: run-level tests first, then
    the board-pooled ones) and, where the runs hold the monitor or the target, study_curves.png
    (each arm over the evaluation points, and its run-paired difference from the reference) in
    `directory`."""
    from t2t_jax.render.forest import forest_plot

    buf = _io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "arm",
            "seed",
            "warm_monitor_avg_valid",
            "monitor_avg_valid",
            "monitor_p_vs_warm",
            "warm_benchmark_valid",
            "benchmark_valid",
            "benchmark_optimal",
            "benchmark_p_vs_warm",
            "monitor_diff_vs_reference",
            "benchmark_diff_vs_reference",
            "warm_target_avg_valid",
            "target_avg_valid",
            "target_diff_vs_reference",
        ]
    )
    for arm, r in summary["arms"].items():
        runs = r.get("vs_reference", {}).get("runs", {})
        for i, (s, x) in enumerate(r["per_seed"].items()):
            writer.writerow(
                [
                    arm,
                    s,
                    x.get("warm_monitor", ""),
                    x.get("monitor", ""),
                    (x.get("monitor_vs_warm") or {}).get("p_value", ""),
                    x["warm_valid"],
                    x["valid"],
                    x["optimal"],
                    (x.get("vs_warm") or {}).get("p_value", ""),
                    *(runs[m]["per_run"][i] if m in runs else "" for m in ("monitor", "benchmark")),
                    x.get("warm_target", ""),
                    x.get("target", ""),
                    runs["target"]["per_run"][i] if "target" in runs else "",
                ]
            )
    paths = {ext: os.path.join(directory, f"study.{ext}") for ext in ("json", "csv", "md")}
    io.write_atomic(paths["json"], json.dumps({"command": command, **summary}, indent=1))
    io.write_atomic(paths["csv"], buf.getvalue())
    io.write_atomic(paths["md"], study_markdown(summary, command))
    title = (
        f"Seeds {summary['seeds']}. Across runs (primary): mean of per-run differences, 95% t-interval, "
        "dark p < 0.05. Pooled boards (evaluation noise given the runs): dark p < 0.01."
    )
    paths["png"] = os.path.join(directory, "study.png")
    io.write_png(paths["png"], forest_plot(forest_panels(summary), title=title))
    panels = curve_panels(summary)
    if panels:
        from t2t_jax.render.curves import rate_curves

        paths["curves"] = os.path.join(directory, "study_curves.png")
        names = next(iter(summary["arms"].values()))["curves"][panels[0][3]]["points"]
        label = lambda i: "warm" if names[i] == "warm_start" else names[i].replace("stage_", "s")  # noqa: E731
        title = (
            f"{len(summary['seeds'])} runs per arm: mean over runs, whiskers 95% t-interval over runs; "
            f"right: paired difference from {summary['reference']}"
        )
        io.write_png(paths["curves"], rate_curves([p[:3] for p in panels], title=title, x_label=label))
    return paths


def curve_panels(summary: dict) -> list[tuple]:
    """The curves figure's panels: per sampled metric (target first) its level per arm and, with
    more than one arm, each arm's run-paired difference from the reference (in %, each panel's
    own y range); (title, series, (y_lo, y_hi), metric)."""
    arms = summary["arms"]
    metrics = [m for m in ("target", "monitor") if all(m in (r.get("curves") or {}) for r in arms.values())]
    panels = []
    for metric in metrics:
        kinds = [("level", f"{metric}: avg@k valid")]
        if len(arms) > 1:
            kinds.append(("vs_reference", f"{metric}: arm - {summary['reference']}, paired by run"))
        for kind, name in kinds:
            series = []
            for arm, r in arms.items():
                got = r["curves"][metric].get(kind)
                if got is None:
                    continue
                lows, highs = ([100 * g["ci95"][j] for g in got] for j in (0, 1))
                series.append((arm, list(range(len(got))), [100 * g["mean"] for g in got], lows, highs, False))
            if not series:
                continue
            lo = min(min(s[3]) for s in series)
            hi = max(max(s[4]) for s in series)
            pad = max(0.5, 0.1 * (hi - lo))
            y = (0.0, hi + pad) if kind == "level" else (min(0.0, lo - pad), max(0.0, hi + pad))
            panels.append((name, series, y, metric))
    return panels
