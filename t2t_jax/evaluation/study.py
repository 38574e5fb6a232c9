"""A study: arms (config overrides) x seeds of the stage loop, and what they show together.

    arms = parse_arms("grpo,shuffle,fixed,lr3e-4:optim.learning_rate=3e-4+grpo.steps=32")
    summary = summarize(results, reference="grpo")   # results[arm][seed] = a run's results.json
    write_study(directory, summary)                  # study.md, study.csv, study.json
    results = collect(["runs/study_s0", "runs/study_s1"])  # finished studies' runs, merged

Every arm of one seed starts from the same warm start (launch/study.py runs it once and copies
it), so the arms of a seed are compared on the same boards with paired tests: the monitor's
avg@k by a paired permutation test (`benchmark.paired_sampled_change`), the benchmark's greedy
valid rate by the exact McNemar test (`benchmark.paired_change`), per seed and pooled over the
seeds (the (seed, board) pairs of all seeds in one test). Across seeds, each figure is the mean
with a 95% t-interval over the seeds (wide with three: t = 4.30).
"""

from __future__ import annotations

import csv
import io as _io
import json
import os

import numpy as np

from t2t_jax.env import io
from t2t_jax.evaluation import benchmark

# Named arms: the stage-loop config overrides each stands for.
ARMS = {
    "grpo": (),
    "shuffle": ("grpo.control=shuffle",),
    **{kind: (f"engineer.kind={kind}",) for kind in ("self", "fixed", "random", "frontier", "learnability")},
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
                if not (name.startswith("seed_") and name[5:].isdigit() and os.path.isfile(path)):
                    continue
                if os.path.isfile(os.path.join(run, "config.json")) and not finished(run):
                    continue  # a run still going (or stopped part-way): its last point is not the end
                seed = int(name[5:])
                if seed in results.get(arm, {}):
                    raise ValueError(f"--merge: arm {arm!r} seed {seed} is in both {where[arm, seed]} and {path}")
                with open(path) as f:
                    results.setdefault(arm, {})[seed] = json.load(f)
                where[arm, seed] = path
    if not results:
        raise ValueError(f"--merge: no ARM/seed_S/results.json under {directories}")
    for seed in sorted({s for by_seed in results.values() for s in by_seed}):
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
    keep = {arm: {s: results[arm][s] for s in sorted(seeds)} for arm in order if seeds <= set(results[arm])}
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
    if all("monitor" in e for e in entries_a + entries_b):

        def cat(es):
            return {
                "k": es[0]["monitor"]["k"],
                "point": es[0]["point"],
                "board_valid_counts": sum((e["monitor"]["board_valid_counts"] for e in es), []),
            }

        out["monitor"] = benchmark.paired_sampled_change(cat(entries_a), cat(entries_b))
    out["benchmark"] = benchmark.paired_change(
        {"point": entries_a[0]["point"], "board_valid": "".join(e["board_valid"] for e in entries_a)},
        {"board_valid": "".join(e["board_valid"] for e in entries_b)},
    )
    return out


def summarize(results: dict, reference: str) -> dict:
    """results[arm][seed] = a finished run's results (launch.main's results.json: the warm start
    first, the last stage last) -> the study's summary (see the module docstring)."""
    if reference not in results:
        raise ValueError(f"--reference: {reference!r} is not one of the arms {sorted(results)}")
    seeds = sorted(results[reference])
    arms = {}
    for arm, by_seed in results.items():
        if sorted(by_seed) != seeds:
            raise ValueError(f"arm {arm!r} has seeds {sorted(by_seed)}, the reference {seeds}")
        last = [by_seed[s][-1] for s in seeds]
        first = [by_seed[s][0] for s in seeds]
        vs_warm = _pooled(first, last)
        row = {
            "seeds": seeds,
            "per_seed": {},
            "benchmark_valid": _interval([e["valid"] for e in last]),
            "benchmark_optimal": _interval([e["optimal"] for e in last]),
            "benchmark_vs_warm": vs_warm["benchmark"],
        }
        if all("monitor" in e for e in last):
            row["monitor_avg_valid"] = _interval([e["monitor"]["avg_valid"] for e in last])
            row["monitor_gain"] = _interval(
                [e["monitor"]["avg_valid"] - f["monitor"]["avg_valid"] for e, f in zip(last, first)]
            )
            row["monitor_vs_warm"] = vs_warm["monitor"]
        for s, e, f in zip(seeds, last, first):
            seed_row = {
                "warm_valid": f["valid"],
                "valid": e["valid"],
                "optimal": e["optimal"],
                "vs_warm": e.get("vs_first"),
            }
            if "monitor" in e:
                seed_row.update(
                    warm_monitor=f["monitor"]["avg_valid"],
                    monitor=e["monitor"]["avg_valid"],
                    monitor_vs_warm=e.get("monitor_vs_first"),
                )
            row["per_seed"][str(s)] = seed_row
        if arm != reference:
            ref_last = [results[reference][s][-1] for s in seeds]
            row["vs_reference"] = {
                "pooled": _pooled(ref_last, last),
                "per_seed": {str(s): _pooled([r], [e]) for s, r, e in zip(seeds, ref_last, last)},
            }
        arms[arm] = row
    k = next((e["monitor"]["k"] for e in (results[reference][s][-1] for s in seeds) if "monitor" in e), None)
    return {"reference": reference, "seeds": seeds, "monitor_k": k, "arms": arms}


def _fmt(i: dict, scale: float = 100.0) -> str:
    return f"{scale * i['mean']:.2f} [{scale * i['ci95'][0]:.2f}, {scale * i['ci95'][1]:.2f}]"


def _test(d: dict) -> str:
    return f"{100 * d['diff']:+.2f} [{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}], p = {d['p_value']:.4f}"


def study_markdown(summary: dict, command: str = "") -> str:
    """The study as a Markdown report: per arm the means over seeds, the paired tests against
    the warm start and against the reference arm, and a plain list of what is significant."""
    ref, k, arms = summary["reference"], summary["monitor_k"], summary["arms"]
    lines = ["# Study", ""]
    if command:
        lines += ["```", command, "```", ""]
    lines += [
        f"Seeds {summary['seeds']}; reference arm `{ref}`. Figures in %: mean over seeds [95% t-interval "
        "over seeds]; paired differences [95% interval over boards], p from the paired test "
        f"(monitor: avg@{k} valid, paired permutation; benchmark: greedy valid, exact McNemar), pooled "
        "over the (seed, board) pairs of all seeds.",
        "",
        f"| arm | monitor avg@{k} valid | monitor gain vs warm start | paired vs warm start (monitor) | "
        "benchmark valid | paired vs warm start (benchmark) |",
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
    lines += [
        "",
        f"Against the reference arm `{ref}` (other minus reference), pooled over seeds, then per seed:",
        "",
        "| arm | monitor (pooled) | benchmark (pooled) | monitor per seed | benchmark per seed |",
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
        "Per seed (warm start -> end, %):",
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
    lines += ["", "## Significant at p < 0.01 (pooled paired tests)", ""]
    found = []
    for arm, r in arms.items():
        tests = [
            ("monitor vs warm start", r.get("monitor_vs_warm")),
            ("benchmark vs warm start", r["benchmark_vs_warm"]),
        ]
        if "vs_reference" in r:
            tests += [
                (f"monitor vs {ref}", r["vs_reference"]["pooled"].get("monitor")),
                (f"benchmark vs {ref}", r["vs_reference"]["pooled"]["benchmark"]),
            ]
        found += [f"- `{arm}`: {name} {_test(d)}" for name, d in tests if d and d["p_value"] < 0.01]
    lines += found or ["- nothing"]
    return "\n".join(lines) + "\n"


def forest_panels(summary: dict) -> list[tuple[str, list[tuple]]]:
    """The pooled paired tests as forest-plot panels (t2t_jax/render/forest.py): each arm against
    the warm start, then each other arm against the reference, monitor and benchmark."""

    def row(arm, d):
        return (arm, d["diff"], d["ci95"][0], d["ci95"][1], d["p_value"])

    ref, arms, k = summary["reference"], summary["arms"], summary["monitor_k"]
    panels = [
        (
            f"monitor avg@{k} valid vs warm start",
            [row(a, r["monitor_vs_warm"]) for a, r in arms.items() if "monitor_vs_warm" in r],
        ),
        ("benchmark greedy valid vs warm start", [row(a, r["benchmark_vs_warm"]) for a, r in arms.items()]),
    ]
    others = {a: r["vs_reference"]["pooled"] for a, r in arms.items() if "vs_reference" in r}
    if others:
        panels += [
            (f"monitor vs {ref}", [row(a, v["monitor"]) for a, v in others.items() if "monitor" in v]),
            (f"benchmark vs {ref}", [row(a, v["benchmark"]) for a, v in others.items()]),
        ]
    return [p for p in panels if p[1]]


def write_study(directory: str, summary: dict, command: str = "") -> dict:
    """study.json (the summary), study.csv (arm x seed rows), study.md and study.png (the forest
    plot of the pooled paired tests) in `directory`."""
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
        ]
    )
    for arm, r in summary["arms"].items():
        for s, x in r["per_seed"].items():
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
                ]
            )
    paths = {ext: os.path.join(directory, f"study.{ext}") for ext in ("json", "csv", "md")}
    io.write_atomic(paths["json"], json.dumps({"command": command, **summary}, indent=1))
    io.write_atomic(paths["csv"], buf.getvalue())
    io.write_atomic(paths["md"], study_markdown(summary, command))
    title = f"Paired differences, pooled over seeds {summary['seeds']} (dark: p < 0.01)"
    paths["png"] = os.path.join(directory, "study.png")
    io.write_png(paths["png"], forest_plot(forest_panels(summary), title=title))
    return paths
