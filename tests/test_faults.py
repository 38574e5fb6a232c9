"""launch.faults: its cases are classed by what the launcher did (a traceback, an accepted bad
value, an unnamed error, something written despite the refusal), and the launchers refuse the
cases tried here cleanly (the whole sweep's figures are in docs/reliability.md)."""

import json
import os
import subprocess
import sys

import pytest

from launch import faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_outcomes_are_classed_by_what_reached_the_user(tmp_path):
    named = "error: grpo.group_size: 1 is not an integer >= 2"
    assert faults.classify(2, named, ("grpo.group_size",), str(tmp_path / "run")) == "clean"
    assert faults.classify(1, "Traceback (most recent call last):\n  ...\nKeyError: 'x'", ("x",), None) == "traceback"
    assert faults.classify(0, "done", ("x",), None) == "accepted"
    assert faults.classify(None, "", ("x",), None) == "accepted"  # (still running at the timeout)
    assert faults.classify(2, "error: something is wrong", ("grpo.group_size",), None) == "unnamed"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    assert faults.classify(2, named, ("grpo.group_size",), str(tmp_path / "run")) == "wrote"


def sweep(*flags):
    out = subprocess.run(
        [sys.executable, "-m", "launch.faults", *flags],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [r for r in rows if "case" in r], [r for r in rows if "cases" in r]


@pytest.mark.slow  # (three launch.main subprocesses; single refusals: tests/test_config_schema.py)
def test_bad_config_values_are_refused_cleanly():
    cases, summary = sweep("--areas=config", "--fields=grpo.steps,rollout.kv")
    assert [c["flag"] for c in cases] == [
        "--config.grpo.steps=-1",
        "--config.grpo.steps=ten",
        "--config.rollout.kv=bogus",
    ]
    assert all(c["outcome"] == "clean" for c in cases), [c for c in cases if c["outcome"] != "clean"]
    assert summary == [
        {"area": "config", "cases": 3, "clean": 3, "traceback": 0, "accepted": 0, "unnamed": 0, "wrote": 0}
    ]


@pytest.mark.slow
def test_bad_board_files_paths_and_eval_runs_are_refused_cleanly():
    cases, summary = sweep("--areas=mapf,eval")
    assert all(c["outcome"] == "clean" for c in cases), [c for c in cases if c["outcome"] != "clean"]
    assert [s["area"] for s in summary] == ["mapf", "eval"] and summary[0]["cases"] >= 25 and summary[1]["cases"] == 3


# -- issue 31: the widened sweep -------------------------------------------------------------------


def test_a_refusal_must_leave_what_was_there_as_it_was(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.png").write_text("x")
    before = faults.snapshot(str(out))
    assert faults.classify(2, "error: --plans: p", ("--plans",), str(out), before) == "clean"
    (out / "board_0.png").write_text("partial")
    assert faults.classify(2, "error: --plans: p", ("--plans",), str(out), before) == "wrote"
    (tmp_path / "empty").mkdir()  # (an empty directory left behind is no data)
    assert faults.classify(2, "error: --out: x", ("--out",), str(tmp_path / "empty")) == "clean"


def test_every_numeric_flag_gets_wrong_type_non_finite_huge_and_out_of_range_values():
    assert faults.flag_values({"type": "int", "lower_bound": "1", "upper_bound": "150"}) == ["x", str(10**30), "0"]
    assert faults.flag_values({"type": "int"}) == ["x", str(10**30), "-1", "0"]  # (no bounds declared)
    assert faults.flag_values({"type": "float", "lower_bound": "0.001"}) == ["x", "nan", "inf", "-0.999"]
    assert faults.flag_values({"type": "bool"}) == ["maybe"]
    assert faults.flag_values({"type": "comma separated list of strings"}) == []


def test_the_areas_are_registered_and_each_launcher_declares_bounds_on_every_number():
    assert {"config", "overrides", "flags", "mapf", "eval", "eval_runs"} <= set(faults.AREAS)
    declared = faults.declared_flags("launch.eval")  # (one subprocess: its --helpxml)
    bounded = {"per_cell", "batch_size", "samples", "seed", "timeout", "max_new_tokens", "concurrency", "retries"}
    numbers = [f for f in declared if f["name"] in bounded]
    assert len(numbers) == len(bounded)  # (--top_p is checked in main, on every run)
    assert all(f.get("lower_bound") is not None and f.get("upper_bound") is not None for f in numbers), numbers


@pytest.mark.slow
def test_mistyped_overrides_bad_flags_and_damaged_runs_are_refused_cleanly():
    cases, summary = sweep("--areas=overrides,flags,eval_runs", "--launchers=eval,study")
    assert all(c["outcome"] == "clean" for c in cases), [c for c in cases if c["outcome"] != "clean"]
    assert [s["area"] for s in summary] == ["overrides", "flags", "eval_runs"]
    assert summary[0]["cases"] >= 20 and summary[1]["cases"] >= 40 and summary[2]["cases"] >= 12
