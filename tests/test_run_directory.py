"""The run directory is the record (t2t_jax/rundir.py): a fresh start refuses an existing run
before touching it, config.json is written once, a resume refuses changes to the run's maths
unless allowed (and records them), one process per directory."""

import json
import os
import subprocess
import sys

import pytest

import configs.stage
from t2t_jax import rundir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}


def config(**changes):
    c = configs.stage.get_config("smoke")
    for path, value in changes.items():
        section, field = path.split("__") if "__" in path else (None, path)
        (c[section] if section else c)[field] = value
    return c


def test_fresh_start_writes_config_once_and_refuses_an_existing_run(tmp_path):
    workdir = tmp_path / "run"
    run = rundir.open_run(str(workdir), config())
    written = (workdir / "config.json").read_text()
    assert json.loads(written)["seed"] == 0
    run.close()
    with pytest.raises(rundir.RunDirError, match="already holds a run .*pass --resume"):
        rundir.open_run(str(workdir), config(seed=5))
    assert (workdir / "config.json").read_text() == written  # untouched
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(rundir.RunDirError, match="already holds a run"):
        rundir.open_run(str(tmp_path / "other"), config())
    assert os.listdir(tmp_path / "other") == ["notes.txt"]


def test_a_failed_fresh_start_leaves_nothing(tmp_path):
    workdir = tmp_path / "run"
    rundir.open_run(str(workdir), config()).close(failed=True)
    assert not workdir.exists()
    (tmp_path / "empty").mkdir()
    run = rundir.open_run(str(tmp_path / "empty"), config())
    (tmp_path / "empty" / "tb").mkdir()
    run.close(failed=True)
    assert os.listdir(tmp_path / "empty") == []


def test_resume_refuses_a_change_to_the_maths_and_names_the_fields(tmp_path):
    workdir = str(tmp_path / "run")
    rundir.open_run(workdir, config()).close()
    with pytest.raises(
        rundir.RunDirError,
        match=r"changes the run's maths: grpo.steps: 2 -> 7; seed: 0 -> 3\. .*"
        r"--allow_changes=grpo.steps,seed",
    ):
        rundir.open_run(workdir, config(seed=3, grpo__steps=7), resume=True)
    with pytest.raises(rundir.RunDirError, match="model.preset: 'tiny' -> 'qwen3-0.6b'"):
        rundir.open_run(workdir, config(model__preset="qwen3-0.6b"), resume=True)
    assert not os.path.exists(os.path.join(workdir, "history.jsonl"))
    # Not the maths (the stage count, the evaluation): accepted and recorded.
    rundir.open_run(workdir, config(stages=4), resume=True).close()
    # Allowed: accepted and recorded; config.json stays the config the run began with.
    rundir.open_run(workdir, config(stages=4, grpo__control="shuffle"), resume=True, allow=["grpo.control"]).close()
    history = rundir.read_history(workdir)
    assert [h["changes"] for h in history] == [{"stages": [2, 4]}, {"grpo.control": ["none", "shuffle"]}]
    assert history[1]["allowed"] == ["grpo.control"]
    assert json.load(open(os.path.join(workdir, "config.json")))["stages"] == 2
    current = rundir.current_config(workdir)
    assert current["stages"] == 4 and current["grpo"]["control"] == "shuffle"
    rundir.open_run(workdir, config(stages=4, grpo__control="shuffle"), resume=True).close()  # no change now
    assert len(rundir.read_history(workdir)) == 2
    with pytest.raises(rundir.RunDirError, match="--allow_changes: 'grpo.stepz' is not a config field"):
        rundir.open_run(workdir, config(), resume=True, allow=["grpo.stepz"])
    with pytest.raises(rundir.RunDirError, match="holds no config.json"):
        rundir.open_run(str(tmp_path / "nothing"), config(), resume=True)


def test_a_second_process_on_the_same_directory_refuses_at_once(tmp_path):
    workdir = tmp_path / "run"
    held = rundir.open_run(str(workdir), config())
    try:
        with pytest.raises(rundir.RunDirError, match="in use by another process"):
            rundir.open_run(str(workdir), config(), resume=True)
        with pytest.raises(rundir.RunDirError, match=f"its lock {workdir}/.lock is held by host .*, pid {os.getpid()}"):
            rundir.open_run(str(workdir), config(), resume=True)  # (the message names the lock and its owner)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "launch.main",
                "--config=configs/stage.py:smoke",
                f"--workdir={workdir}",
                "--resume",
                "--noprogress",
            ],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("error: ")
        assert "in use by another process" in out.stderr and "Traceback" not in out.stderr
    finally:
        held.close()
    rundir.open_run(str(workdir), config(), resume=True).close()  # free again once released
