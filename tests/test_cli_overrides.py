"""Issue 31: a mistyped config file or override is one line naming the flag, with the closest
field (difflib), exit 2: checked before ml_collections loads them (t2t_jax/cli.py
`config_error`), at import for a default config and while absl parses the flags for a given
one; a flag absl refuses is one line, exit 2, too."""

import os
import subprocess
import sys

import pytest

from t2t_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}
STAGE = "--config=configs/stage.py"


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # (config paths are relative to the repository, as on the command line)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config.grpo.stepz=3"], "--config.grpo.stepz: unknown field grpo.stepz; did you mean grpo.steps?"),
        ([STAGE, "--config.grpo.stepz=3"], "--config.grpo.stepz: unknown field grpo.stepz; did you mean grpo.steps?"),
        (
            ["--config.grpoo.steps=3"],
            "--config.grpoo.steps: unknown field grpoo.steps (no section grpoo); did you mean grpo.steps?",
        ),
        (["--config.rollout.temprature=0.5"], "did you mean rollout.temperature?"),
        (["--config.sead=1"], "--config.sead: unknown field sead; did you mean seed?"),
        ([STAGE, "--noconfig.train.share_promts"], "did you mean train.share_prompts?"),
        (["--config", "configs/stage.py", "--config.grpo.stepz", "3"], "did you mean grpo.steps?"),
        (
            ["--config=configs/qwen3_4b.py", "--config.mesh.fsdpp=2"],
            "--config.mesh.fsdpp: unknown mesh axis mesh.fsdpp; did you mean mesh.fsdp?",
        ),
        (["--config.mesh.fsdp=2"], "--config.mesh.fsdp: unknown mesh axis mesh.fsdp (this config's mesh axes: none)"),
        ([STAGE, "--config.grpo.steps.x=3"], "--config.grpo.steps.x: grpo.steps is a field (int), not a section"),
        (["--config=configs/nosuch.py"], "--config=configs/nosuch.py: configs/nosuch.py: no such file"),
        (["--config=configs"], "--config=configs: configs is a directory, not a config file"),
        (
            ["--config=configs/stage.py:nosuch"],
            "--config=configs/stage.py:nosuch: configs/stage.py: unknown argument 'nosuch' (known: smoke)",
        ),
        (["--config=README.md"], "--config=README.md: README.md is not a Python config file"),
    ],
)
def test_mistyped_configs_and_overrides_are_one_line_naming_the_flag(argv, message):
    error = cli.config_error(["launch.main", *argv], "config", "configs/stage.py")
    assert error is not None and message in error and "\n" not in error, error


def test_config_files_that_are_not_configs(tmp_path):
    (tmp_path / "syntax.py").write_text("def get_config(:\n")
    (tmp_path / "none.py").write_text("x = 1\n")
    (tmp_path / "noarg.py").write_text("def get_config():\n    return {'a': 1}\n")
    (tmp_path / "binary.py").write_bytes(b"\x89PNG\r\n\x00\xff")
    check = cli.config_error
    assert f"{tmp_path}/syntax.py:1:" in check(["x", f"--config={tmp_path}/syntax.py"])
    assert "defines no get_config()" in check(["x", f"--config={tmp_path}/none.py"])
    assert "get_config takes no argument (got 'x')" in check(["x", f"--config={tmp_path}/noarg.py:x"])
    assert "is not a Python config file" in check(["x", f"--config={tmp_path}/binary.py"])
    assert check(["x", f"--config={tmp_path}/noarg.py", "--config.b=2"]) == (
        "--config.b: unknown field b (known at the top: a)"
    )


def test_good_command_lines_pass():
    assert cli.config_error(["x"], "config", "configs/stage.py") is None  # (the default, as it is)
    assert cli.config_error(["x", STAGE, "--config.grpo.steps=3", "--config.mesh={'fsdp': 2}"]) is None
    assert cli.config_error(["x", "--config=configs/stage.py:smoke", "--noconfig.train.share_prompts"]) is None
    assert cli.config_error(["x", "--config=configs/qwen3_4b.py", "--config.mesh.fsdp=4"]) is None
    assert cli.config_error(["x", "--config.grpo.steps=3"], "config", None) == (
        "--config.grpo.steps: give the config file first (--config=FILE)"
    )


def launch(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "args, message",
    [
        # the default config: ml_collections resolves the override at import (a traceback before)
        (["launch.main", "--config.grpoo.steps=3"], "did you mean grpo.steps?"),
        # a given config: resolved while absl parses the flags (a traceback before)
        (["launch.main", STAGE, "--config.mesh.foo=2"], "--config.mesh.foo: unknown mesh axis"),
        # absl's own refusal (exit 1 and two lines before; --per_cell=0 a traceback)
        (["launch.eval", "--run=runs/nosuch", "--per_cell=0"], "flag --per_cell=0: 0 is not an integer in the range"),
    ],
)
def test_launchers_exit_2_with_one_line(tmp_path, args, message):
    out = launch(*args, f"--workdir={tmp_path / 'run'}" if args[0] == "launch.main" else f"--out={tmp_path / 'o'}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [out.stderr.strip().splitlines()[-1]], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and message in out.stderr
    assert not os.path.exists(tmp_path / "run") and not os.path.exists(tmp_path / "o")
