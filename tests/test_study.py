"""launch.study: arms from the command line, the summary's statistics, the report, and (slow) a
whole study of the smoke config resumed after an interruption."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from scipy.stats import ttest_1samp

from t2t_jax.evaluation import study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_parse_arms():
    arms = study.parse_arms("grpo,shuffle,frontier,fast:optim.learning_rate=3e-4+grpo.steps=4")
    assert arms == {
        "grpo": (),
        "shuffle": ("grpo.control=shuffle",),
        "frontier": ("engineer.kind=frontier",),
        "fast": ("optim.learning_rate=3e-4", "grpo.steps=4"),
    }
    for bad, message in (
        ("grpo,grpo", "appears twice"),
        ("nonsense", "is not one of"),
        ("", "no arm"),
        ("x:steps", "key=value"),
        ("warm_start:seed=1", "not warm_start"),
        ("a b:x=1", "letters"),
    ):
        with pytest.raises(ValueError, match=message):
            study.parse_arms(bad)


def run_results(rng, warm_counts, gain, boards=40, k=4):
    """A fake results.json: the warm start, then a last stage whose monitor counts rose by `gain`."""
    end = np.clip(warm_counts + rng.binomial(1, gain, boards) * rng.integers(0, 3, boards), 0, k)

    def point(name, counts):
        valid = "".join("1" if c >= 2 else "0" for c in counts)
        return {
            "point": name,
            "boards": boards,
            "valid": valid.count("1") / boards,
            "optimal": 0.0,
            "board_valid": valid,
            "monitor": {"k": k, "avg_valid": float(counts.mean() / k), "board_valid_counts": counts.tolist()},
        }

    return [point("warm_start", warm_counts), point("stage_2", end)]


def test_summary_pairs_arms_on_the_same_boards(tmp_path):
    rng = np.random.default_rng(0)
    warm = {s: rng.integers(0, 3, 40) for s in (0, 1, 2)}
    results = {
        "grpo": {s: run_results(rng, warm[s], 0.9) for s in warm},
        "shuffle": {s: run_results(rng, warm[s], 0.0) for s in warm},
    }
    summary = study.summarize(results, "grpo")
    g, c = summary["arms"]["grpo"], summary["arms"]["shuffle"]
    assert g["monitor_gain"]["mean"] > 0.1 and c["monitor_gain"]["mean"] == 0
    assert g["monitor_vs_warm"]["p_value"] < 0.01 and c["monitor_vs_warm"]["p_value"] == 1.0
    assert g["monitor_vs_warm"]["boards"] == 120  # pooled over the (seed, board) pairs
    lo, hi = g["monitor_avg_valid"]["ci95"]
    assert lo <= g["monitor_avg_valid"]["mean"] <= hi and g["monitor_avg_valid"]["seeds"] == 3
    assert c["vs_reference"]["pooled"]["monitor"]["diff"] < 0 and set(c["vs_reference"]["per_seed"]) == {"0", "1", "2"}
    # The primary test is across the 3 runs: per seed the mean over its boards, then a paired t.
    runs = c["vs_reference"]["runs"]["monitor"]
    per_seed = [
        np.mean(results["shuffle"][s][-1]["monitor"]["board_valid_counts"]) / 4
        - np.mean(results["grpo"][s][-1]["monitor"]["board_valid_counts"]) / 4
        for s in (0, 1, 2)
    ]
    assert runs["runs"] == 3 and np.allclose(runs["per_run"], per_seed, atol=1e-6)
    assert runs["p_value"] == pytest.approx(ttest_1samp(per_seed, 0).pvalue, abs=1e-4)
    assert runs["p_exact_min"] == 0.25 and runs["p_exact"] >= 0.25 and runs["power"]["exact_min_runs"] == 6
    assert runs["p_holm"] >= runs["p_value"]  # adjusted over the study's 2 x 2 + 2 run-level tests
    assert g["runs_vs_warm"]["monitor"]["diff"] == pytest.approx(g["monitor_gain"]["mean"], abs=1e-4)
    assert list(c["vs_reference"]) == ["runs", "pooled", "per_seed"] and summary["tests"]["runs"]["role"].startswith(
        "primary"
    )
    paths = study.write_study(str(tmp_path), summary, "python -m launch.study ...")
    md = open(paths["md"]).read()
    assert "| grpo |" in md and "| shuffle |" in md and "## Significant at p < 0.01" in md
    assert md.index("## Across runs (primary)") < md.index("## Evaluation noise given the runs (secondary)")
    assert "`shuffle` vs grpo, monitor:" in md and "### Power" in md and "exact sign-flip test cannot reach" in md
    assert "6 run-level tests at p < 0.05" in md and "10 distinct resamples" in md
    assert "`grpo`: monitor vs warm start" in md and "`shuffle`: monitor vs grpo" in md
    rows = list(csv.DictReader(open(paths["csv"])))
    assert len(rows) == 6 and rows[0]["monitor_diff_vs_reference"] == ""
    assert float(rows[3]["monitor_diff_vs_reference"]) == pytest.approx(per_seed[0], abs=1e-6)
    assert json.load(open(paths["json"]))["command"] == "python -m launch.study ..."
    panels = {title: (rows, alpha) for title, rows, alpha in study.forest_panels(summary)}
    assert list(panels)[0] == "across 3 runs: monitor avg@4 valid vs warm start" and panels[
        "across 3 runs: monitor avg@4 valid vs grpo"
    ][1] == pytest.approx(0.05)
    assert [r[0] for r in panels["eval noise, pooled boards: monitor avg@4 valid vs grpo"][0]] == ["shuffle"]
    assert len(panels["eval noise, pooled boards: benchmark greedy valid vs warm start"][0]) == 2
    one = study.summarize({a: {0: r[0]} for a, r in results.items()}, "grpo")  # one run: no test across runs
    assert one["arms"]["shuffle"]["vs_reference"]["runs"]["monitor"]["p_value"] is None
    assert all(not t.startswith("across") for t, _, _ in study.forest_panels(one))
    assert "no test across runs is possible" in study.study_markdown(one)
    assert Image.open(paths["png"]).size[0] > 0
    # The curves: each arm at every point (mean over runs), and its run-paired difference from grpo.
    curve = c["curves"]["monitor"]
    assert curve["points"] == ["warm_start", "stage_2"] and "vs_reference" not in g["curves"]["monitor"]
    assert curve["vs_reference"][0]["mean"] == 0 and curve["vs_reference"][1]["mean"] == pytest.approx(
        np.mean(per_seed), abs=1e-4
    )
    assert curve["level"][1]["mean"] == c["monitor_avg_valid"]["mean"]
    assert [(p[0], [x[0] for x in p[1]]) for p in study.curve_panels(summary)] == [
        ("monitor: avg@k valid", ["grpo", "shuffle"]),
        ("monitor: arm - grpo, paired by run", ["shuffle"]),
    ]
    assert Image.open(paths["curves"]).size[0] > 0 and "study_curves.png" in md
    with pytest.raises(ValueError, match="--reference: 'control'"):
        study.summarize(results, "control")
    with pytest.raises(ValueError, match="arm 'shuffle' has seeds"):
        study.summarize({"grpo": results["grpo"], "shuffle": {0: results["shuffle"][0]}}, "grpo")


def study_cmd(workdir, *extra):
    return [
        sys.executable,
        "-m",
        "launch.study",
        "--config=configs/stage.py:smoke",
        "--arms=grpo,shuffle",
        "--seeds=0",
        f"--workdir={workdir}",
        "--config.stages=1",
        *extra,
    ]


def test_dry_run_lists_the_runs(tmp_path):
    out = subprocess.run(study_cmd(tmp_path, "--dry_run"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and "--config.stages=0" in lines[0] and "--resume" not in lines[0]
    assert "--resume" in lines[2] and lines[2].endswith("--config.grpo.control=shuffle")
    assert all("--config.stages=1" in line for line in lines)
    # Two seeds: the warm starts first, then run by run every arm (a study stopped part way holds
    # whole sets of paired runs).
    out = subprocess.run(
        study_cmd(tmp_path, "--dry_run", "--seeds=0,1"), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    order = [(line.split("--workdir=")[1].split()[0].split("/")[-2:]) for line in out.stdout.splitlines()]
    assert order == [
        ["warm_start", "seed_0"],
        ["warm_start", "seed_1"],
        ["grpo", "seed_0"],
        ["shuffle", "seed_0"],
        ["grpo", "seed_1"],
        ["shuffle", "seed_1"],
    ], order
    bad = subprocess.run(
        study_cmd(tmp_path, "--arms=grpo,bogus"), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert bad.returncode != 0 and "'bogus' is not one of" in bad.stderr


def write_runs(directory, results):
    """results[arm][seed] as launch.study lays runs out: DIR/ARM/seed_S/results.json."""
    for arm, by_seed in results.items():
        for s, points in by_seed.items():
            os.makedirs(os.path.join(directory, arm, f"seed_{s}"))
            with open(os.path.join(directory, arm, f"seed_{s}", "results.json"), "w") as f:
                json.dump(points, f)


def test_merge_reports_over_studies_of_different_seeds(tmp_path):
    """Two one-seed studies merge into one two-seed report; an arm missing a seed is left out; a
    seed whose arms started from different warm starts, or found twice, is refused."""
    rng = np.random.default_rng(1)
    warm = {s: rng.integers(0, 3, 40) for s in (0, 1)}
    s0 = {arm: {0: run_results(rng, warm[0], g)} for arm, g in (("grpo", 0.9), ("shuffle", 0.0))}
    s1 = {arm: {1: run_results(rng, warm[1], g)} for arm, g in (("grpo", 0.9), ("shuffle", 0.0), ("fixed", 0.5))}
    write_runs(tmp_path / "s0", s0)
    write_runs(tmp_path / "s1", s1)
    merged = study.collect([str(tmp_path / "s0"), str(tmp_path / "s1")])
    assert {a: sorted(r) for a, r in merged.items()} == {"grpo": [0, 1], "shuffle": [0, 1], "fixed": [1]}
    kept, partial = study.complete_arms(merged, "grpo")
    assert list(kept) == ["grpo", "shuffle"] and partial == ["fixed"]

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.study",
            f"--merge={tmp_path / 's0'},{tmp_path / 's1'}",
            f"--workdir={tmp_path / 'm'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.load(open(tmp_path / "m" / "study.json"))
    assert report["seeds"] == [0, 1] and sorted(report["arms"]) == ["grpo", "shuffle"]
    assert report["arms"]["grpo"]["monitor_vs_warm"]["boards"] == 80 and "left out" in out.stderr
    again = subprocess.run(
        [sys.executable, "-m", "launch.study", f"--merge={tmp_path / 's0'}", f"--workdir={tmp_path / 's0'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "--workdir" in again.stderr and "Traceback" not in again.stderr

    with pytest.raises(ValueError, match="is in both"):
        study.collect([str(tmp_path / "s1"), str(tmp_path / "s1")])
    other = {"fixed": {0: run_results(rng, rng.integers(0, 3, 40), 0.5)}}
    write_runs(tmp_path / "s0_elsewhere", other)
    with pytest.raises(ValueError, match="seed 0: .* different warm starts"):
        study.collect([str(tmp_path / "s0"), str(tmp_path / "s0_elsewhere")])
    with pytest.raises(ValueError, match="no ARM/seed_S/results.json"):
        study.collect([str(tmp_path / "m")])
    # A run still going (its config.json asks for more stages than results.json holds) is left out.
    going = tmp_path / "going"
    warm, end = s0["grpo"][0]
    three = [warm, {**end, "point": "stage_0"}, {**end, "point": "stage_1"}]
    write_runs(going, {"grpo": {0: three}, "shuffle": {0: three}})
    (going / "grpo" / "seed_0" / "config.json").write_text(json.dumps({"stages": 2}))
    (going / "shuffle" / "seed_0" / "config.json").write_text(json.dumps({"stages": 3}))
    assert list(study.collect([str(going)])) == ["grpo"]
