"""launch.bench_grpo (our side of the whole GRPO step, tiny shapes; TRL's side where TRL is
installed, else the skip note) and launch.gpu_check's CPU smoke mode, each as a user runs it."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # (two launchers end to end, 70 s on an idle 2-core machine)


def rows(*args: str) -> dict:
    env = {**os.environ, "T2T_JAX_REEXEC": "0"}
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return {r["name"]: r for r in map(json.loads, out.stdout.splitlines())}


def test_bench_grpo_times_our_step_and_trls_or_says_why_not():
    args = ["--shapes=tiny", "--prompts=1", "--group_size=2", "--max_new_tokens=8", "--repeats=1"]
    row = rows("launch.bench_grpo", *args)["grpo_step_tiny"]
    assert row["ours_s_per_step"] > 0 and len(row["ours_steps_s"]) == 1
    assert 0 < row["ours_rollout_share"] < 1 and row["ours_rollout_share"] + row["ours_update_share"] == 1
    assert 2 <= row["ours_completion_tokens_per_step"] <= 16
    assert (row["group_size"], row["max_new_tokens"], row["loss_type"]) == (2, 8, "dapo")
    if importlib.util.find_spec("trl") is None:
        assert "TRL is not installed" in row["skipped"] and "ratio" not in row
    else:
        assert row["ratio"] == round(row["trl_s_per_step"] / row["ours_s_per_step"], 2)


def test_gpu_check_smoke_runs_every_row_on_cpu():
    out = rows("launch.gpu_check", "--smoke")
    assert out["platform"]["smoke"] is True
    assert out["attention"]["agree"], out["attention"]
    assert out["engine_tiny"]["useful_tokens_per_s"] > 0, out["engine_tiny"]
    assert out["prefill_tiny"]["tokens_per_s"] > 0 and out["grpo_update_tiny"]["tokens_per_s"] > 0
    generate = out["generate_tiny"]
    assert generate.get("useful_tokens_per_s", 0) > 0 or "torch is not installed" in generate["skipped"]
    assert not any("error" in r for r in out.values()), out
