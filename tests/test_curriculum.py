"""The curriculum testbed (issue 32): the GRPO phase's own seed (`grpo_seed`), runs of an arm
sharing one warm start (launch.study --grpo_seeds), the target distribution (`eval.target`) in
the points and the study, `configs/curriculum.py` and its arms."""

import dataclasses
import json

import ml_collections as mlc
import numpy as np
import pytest

from t2t_jax import fields
from t2t_jax.config.defaults import base
from t2t_jax.loop import Loop
from t2t_jax.rl.step import StepSettings


def test_grpo_seed_defaults_to_the_seed_and_splits_the_grpo_phase_from_the_warm_start():
    c = base()
    c.seed = 3
    loop = Loop(c, None, None, None, None, None, None)
    assert c.grpo_seed is None and fields.grpo_seed(c) == 3 and StepSettings.from_config(c).seed == 3
    assert (loop.grpo_key(100, 1) == loop.key(100, 1)).all()  # default: the keys of before, bit for bit
    c.grpo_seed = 7
    assert fields.grpo_seed(c) == 7 and StepSettings.from_config(c).seed == 7
    assert not (loop.grpo_key(100, 1) == loop.key(100, 1)).all()
    assert (loop.key(7) == Loop(mlc.ConfigDict({"seed": 3}), *[None] * 6).key(7)).all()  # the warm start's
    assert fields.grpo_seed({"seed": 2}) == 2  # a run begun before the field existed


def curriculum_config(arg=""):
    from configs.curriculum import get_config

    return get_config(arg)


def account(valid, breakdown=()):
    return {
        "stage": 0,
        "buckets": [{"bucket": i, "valid": v} for i, v in enumerate(valid)],
        "breakdown": list(breakdown),
    }


def test_the_curriculum_config_validates_and_starts_off_the_frontier():
    from t2t_jax.config import schema
    from t2t_jax.env.config import EnvConfig

    c = curriculum_config()
    schema.validate(c)
    schema.validate(curriculum_config("short"))
    first, target = EnvConfig.from_json(c.env.initial), EnvConfig.from_json(c.eval.target)
    assert len(first.buckets) >= 3 and (c.stages, c.grpo.steps) == (8, 16) and not c.grpo.dynamic_sampling
    assert target.buckets[0].agents == (3, 3) and target.buckets[0].hole_density == (0.0, 0.5)
    assert sum(b.weight for b in first.buckets if b.agents[0] > 3 or b.size[0] >= 8) > 0.5 * sum(
        b.weight for b in first.buckets
    )  # most weight on boards the warm start cannot yet solve
    c.eval.target = json.dumps({**json.loads(c.eval.target), "max_agents": 4})
    with pytest.raises(schema.ConfigError, match="eval.target: its max_agents 4 differs"):
        schema.validate(c)


def test_learnability_differs_from_fixed_on_the_multi_bucket_config():
    from t2t_jax.engineer import baselines
    from t2t_jax.env.config import EnvConfig

    first = EnvConfig.from_json(curriculum_config().env.initial)
    rng = np.random.default_rng(0)
    acc = account([0.5, 0.2, 0.0, 0.0])
    fixed, _ = baselines.fixed(acc, first, first, rng, (2, 5))
    learn, _ = baselines.learnability(acc, first, first, rng, (2, 5))
    assert fixed == first and learn != fixed
    weights = [b.weight for b in learn.buckets]
    assert weights[0] > weights[1] > weights[2] == weights[3]  # p (1 - p) + floor


def test_uniform_and_scripted_engineers():
    from t2t_jax.engineer import baselines
    from t2t_jax.env.config import EnvConfig

    first = EnvConfig.from_json(curriculum_config().env.initial)
    drawn = {baselines.uniform(account([0.0] * 4), first, first, np.random.default_rng(s), (2, 5))[0] for s in range(5)}
    assert len(drawn) == 5 and first not in drawn  # every draw a legal config, each its own
    acc = account([0.9, 0.5, 0.0, 0.0])
    off, reason = baselines.scripted(acc, first, first, None, (2, 5))
    assert "breakdown off" in reason and off.buckets[0].size == (4, 6)
    assert off.buckets[1] == dataclasses.replace(first.buckets[1], weight=3.0)  # on the frontier: kept, weight 3
    cells = [{"bucket": 2, "size": 9, "agents": 3, "holes": [0.4, 0.5], "valid": 0.0}]
    on, reason = baselines.scripted(account([0.9, 0.5, 0.0, 0.0], cells), first, first, None, (2, 5))
    assert "breakdown on" in reason and on.buckets[2].size == (8, 8) and off.buckets[2].size == (7, 9)
    rewrite, reason = baselines.scripted_rewrite(account([0.9, 0.5, 0.0, 0.0], cells), first, first, None, (2, 5))
    assert "rewrite" in reason and len(rewrite.buckets) == 4  # every failing bucket had an easier edit
    assert [b.weight for b in rewrite.buckets][1] == max(b.weight for b in rewrite.buckets)  # the frontier bucket


def test_the_target_and_the_mechanism_in_the_study(tmp_path):
    """eval.target is a third metric beside monitor and benchmark (run-level and pooled tests, the
    levels, the CSV, the forest plot); the share of informative groups per arm is reported."""
    from t2t_jax.evaluation import study
    from t2t_jax.evaluation.points import standard_error

    rng = np.random.default_rng(0)
    warm = {s: rng.integers(0, 3, 30) for s in (0, 1, 2)}

    def run(counts, gain, share):
        def point(name, c, grpo=None):
            valid = "".join("1" if x >= 2 else "0" for x in c)
            sampled = {"k": 4, "avg_valid": float(c.mean() / 4), "board_valid_counts": c.tolist()}
            return {
                "point": name,
                "boards": 30,
                "valid": valid.count("1") / 30,
                "optimal": 0.0,
                "board_valid": valid,
                "monitor": sampled,
                "target": {**sampled, "se_avg_valid": standard_error(c.tolist(), 4)},
                **({"grpo": grpo} if grpo else {}),
            }

        end = np.clip(counts + rng.binomial(1, gain, 30), 0, 4)
        stages = [
            {"steps": 16, "no_signal": 0, "informative_groups": share + d, "samples_per_step": 128.0} for d in (0, 0.1)
        ]
        return [point("warm_start", counts), point("stage_0", end, stages[0]), point("stage_1", end, stages[1])]

    results = {
        "fixed": {s: run(warm[s], 0.0, 0.1) for s in warm},
        "learnability": {s: run(warm[s], 0.9, 0.4) for s in warm},
    }
    summary = study.summarize(results, "fixed")
    arm = summary["arms"]["learnability"]
    assert summary["target_k"] == 4 and set(arm["vs_reference"]["runs"]) == {"monitor", "target", "benchmark"}
    assert arm["target_gain"]["mean"] > 0 and "target" in arm["vs_reference"]["pooled"]
    assert arm["mechanism"]["informative_groups"]["mean"] == pytest.approx(0.45)
    assert arm["mechanism"]["per_stage"] == [0.4, 0.5] and summary["arms"]["fixed"]["mechanism"]["per_stage"] == [
        0.1,
        0.2,
    ]
    paths = study.write_study(str(tmp_path), summary)
    md = open(paths["md"]).read()
    assert "## Mechanism: the GRPO signal each arm gave" in md and "| learnability | 45.00 [" in md
    assert "The target (eval.target" in md and "`learnability` vs fixed, target:" in md
    assert any(
        title.startswith("across 3 runs: target avg@4 valid vs fixed") for title, _, _ in study.forest_panels(summary)
    )
    assert "target_diff_vs_reference" in open(paths["csv"]).readline()
    assert standard_error([0, 4], 4) == pytest.approx(0.5)  # SD 0.707 of the rates over sqrt(2)


@pytest.mark.slow
@pytest.mark.long  # (a whole study: 3 runs of configs/stage.py:smoke, and the command again)
def test_grpo_seeds_share_one_warm_start_and_differ_after_it(tmp_path):
    """launch.study --grpo_seeds: one warm start, two runs of the arm from it that differ (another
    GRPO seed: other training boards and rollouts), each scored on eval.target; the same command
    again keeps the three finished runs."""
    import os
    import subprocess
    import sys

    import jax

    from t2t_jax.stages import StageRunner

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = json.dumps({"max_size": 10, "max_agents": 5, "buckets": [{"size": [3, 10], "agents": 3}]})
    cmd = [
        sys.executable,
        "-m",
        "launch.study",
        "--config=configs/stage.py:smoke",
        "--arms=grpo",
        "--seeds=0",
        "--grpo_seeds=1,2",
        f"--workdir={tmp_path / 's'}",
        "--config.stages=1",
        f"--config.eval.target={target}",
        "--config.eval.target_boards=8",
        "--config.eval.target_samples=2",
        f"--config.compilation_cache={tmp_path / 'cache'}",
    ]
    out = subprocess.run(cmd, cwd=root, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = [tmp_path / "s" / "grpo" / f"seed_0_grpo_{g}" for g in (1, 2)]
    results = [json.load(open(r / "results.json")) for r in runs]
    assert results[0][0] == results[1][0]  # the shared warm start
    assert all(r[-1]["target"]["boards"] == 8 and "target_vs_first" in r[-1] for r in results)
    assert all(r[-1]["grpo"]["steps"] == 2 and r[-1]["grpo"]["informative_groups"] is not None for r in results)
    params = [jax.tree.leaves(StageRunner.from_workdir(str(r)).latest_params()) for r in runs]
    assert any(not np.array_equal(a, b) for a, b in zip(*params))  # the GRPO seeds gave different runs
    summary = json.load(open(tmp_path / "s" / "study.json"))
    assert summary["seeds"] == ["0.1", "0.2"] and "target" in summary["arms"]["grpo"]["runs_vs_warm"]
    again = subprocess.run(cmd, cwd=root, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.count("finished before, kept") == 3, again.stdout[-3000:]
