"""The config schema (t2t_jax/config/schema.py): every bad value is refused in one pass before any work,
in one line naming the field, the value and the legal values; the launchers exit 2 and write
nothing."""

import json
import os
import subprocess
import sys

import pytest

import configs.qwen3_4b
import configs.stage
from t2t_jax.config import schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}


def with_values(config, values: dict) -> dict:
    d = config.to_dict()
    for path, value in values.items():
        node, *keys, leaf = [d, *path.split(".")]
        for k in keys:
            node = node[k]
        node[leaf] = value
    return d


def test_the_shipped_configs_pass():
    for c in (configs.stage.get_config(), configs.stage.get_config("smoke"), configs.qwen3_4b.get_config()):
        schema.validate(c)
    rehearsal = configs.qwen3_4b.get_config("rehearsal")
    schema.validate(rehearsal)
    assert rehearsal.engineer.thinking and rehearsal.grpo.dynamic_sampling  # (the paper config's paths)


def test_every_base_field_is_declared():
    """A field added to t2t_jax/config/defaults.py without a declared type and range fails here."""
    from t2t_jax.config.defaults import base

    declared = set(schema.fields())
    assert set(schema.leaves(base().to_dict())) <= declared


@pytest.mark.parametrize(
    "values, message",
    [
        ({"grpo.steps": -1}, "grpo.steps: -1 is not an integer >= 0"),
        ({"grpo.steps": "5"}, "grpo.steps: '5' is not an integer >= 0"),
        ({"grpo.steps": True}, "grpo.steps: True is not an integer >= 0"),
        ({"grpo.prompts": 0}, "grpo.prompts: 0 is not an integer >= 1"),
        ({"grpo.group_size": 1}, "grpo.group_size: 1 is not an integer >= 2"),
        ({"grpo.loss_type": "ppo"}, "grpo.loss_type: 'ppo' is not one of"),
        ({"grpo.old_logprobs": "bogus"}, "grpo.old_logprobs: 'bogus' is not one of"),
        ({"grpo.control": "permute"}, "grpo.control: 'permute' is not one of"),
        ({"grpo.informative": "length"}, "grpo.informative: 'length' is not one of"),
        ({"grpo.guidance": "teacher"}, "grpo.guidance: 'teacher' is not one of"),
        ({"grpo.guidance": "canonical", "grpo.old_logprobs": "sampler"}, "use grpo.old_logprobs='recompute'"),
        ({"grpo.guidance": "witness", "rollout.enable_thinking": True}, "use rollout.enable_thinking=False"),
        ({"grpo.dynamic_sampling_rounds": 0}, "grpo.dynamic_sampling_rounds: 0 with grpo.dynamic_sampling=True"),
        ({"rollout.temperature": 0.0}, r"rollout.temperature: 0.0 is not a finite number in \(0.0, inf\]"),
        ({"rollout.top_p": 1.5}, r"rollout.top_p: 1.5 is not a finite number in \(0.0, 1.0\]"),
        ({"rollout.max_new_tokens": 0}, "rollout.max_new_tokens: 0 is not an integer >= 1"),
        ({"optim.learning_rate": float("nan")}, "optim.learning_rate: nan is not a finite number"),
        ({"optim.learning_rate": 0.0}, "optim.learning_rate: 0.0 is not a finite number in"),
        ({"optim.b2": 1.0}, r"optim.b2: 1.0 is not a finite number in \[0.0, 1.0\)"),
        ({"sft.learning_rate": float("inf")}, "sft.learning_rate: inf is not a finite number"),
        ({"sft.targets": "teacher"}, "sft.targets: 'teacher' is not one of"),
        ({"sft.extra_targets": "teacher"}, "sft.extra_targets: 'teacher' is not one of"),
        ({"sft.min_valid": 1.5}, r"sft.min_valid: 1.5 is not a finite number in \[0.0, 1.0\]"),
        ({"sft.extra_steps": 0}, "sft.extra_steps: 0 is not an integer >= 1"),
        ({"train.micro_batches": 3}, "train.micro_batches: 3 does not divide the GRPO batch of 16 prompts x 8"),
        ({"train.micro_batches": 0}, "train.micro_batches: 0 is not an integer >= 1"),
        ({"train.temperature": 1.0}, "train.temperature: 1.0 differs from rollout.temperature: 0.7"),
        ({"checkpoint.every": 0}, "checkpoint.every: 0 is not an integer >= 1"),
        ({"checkpoint.keep": 0}, "checkpoint.keep: 0 is not an integer >= 1"),
        ({"stages": -1}, "stages: -1 is not an integer >= 0"),
        ({"model.preset": "qwen3-70b"}, "model.preset: 'qwen3-70b' is not one of"),
        ({"model.dtype": "int8"}, "model.dtype: 'int8' is not one of"),
        ({"mesh": {"data": 0}}, "mesh: {'data': 0} is not a mapping of axis names"),
        ({"mesh": {"data": -1, "fsdp": -1}}, "mesh: .* is not a mapping"),
        ({"env.initial": "{not json"}, r"env.initial: config: not valid JSON \(Expecting property name"),
        (
            {"env.initial": json.dumps({"buckets": [{"size": [3, 4], "agents": 9}]})},
            r"env.initial: buckets\[0\].agents: 9 is outside the legal range \[1, 5\]",
        ),
        (
            {
                "env.initial": json.dumps(
                    {"buckets": [{"size": 3, "agents": 5, "min_distance": 3, "hole_density": 0.5}]}
                )
            },
            r"env.initial: .*unsatisfiable",
        ),
        ({"env.horizon": 0}, "env.horizon: 0 is not an integer in"),
        ({"engineer.kind": "oracle"}, "engineer.kind: 'oracle' is not one of"),
        ({"engineer.agent_range": [3, 1]}, "engineer.agent_range: .* is not a pair"),
        ({"engineer.agent_range": [2, 9]}, "engineer.agent_range: .* goes above env.initial's max_agents 5"),
        ({"engineer.efficiency_threshold": 1.5}, "engineer.efficiency_threshold: 1.5 is not a finite number"),
        ({"eval.per_cell": 0}, r"eval.per_cell: 0 is not an integer in \[1, 150\] or None"),
        ({"eval.monitor_samples": 0}, "eval.monitor_samples: 0 is not an integer >= 1"),
        ({"rewards.valid": float("nan")}, "rewards.valid: nan is not a finite number"),
    ],
)
def test_bad_values_are_named(values, message):
    bad = with_values(configs.stage.get_config(), values)
    with pytest.raises(schema.ConfigError, match=message):
        schema.validate(bad)
    with pytest.raises(ValueError, match=message):  # (a ConfigError is a ValueError)
        schema.validate(bad)


def test_unknown_fields_are_named():
    d = configs.stage.get_config().to_dict()
    d["grpo"]["stepz"] = 3
    d["colour"] = "blue"
    with pytest.raises(schema.ConfigError, match="colour: unknown field .*also unknown: grpo.stepz"):
        schema.validate(d)


def test_an_old_run_without_newer_fields_still_validates():
    d = configs.stage.get_config().to_dict()
    del d["grpo"]["control"], d["eval"]["monitor"]
    schema.validate(d)


def test_a_missing_checkpoint_directory_is_named(tmp_path):
    c = configs.stage.get_config()
    c.model.checkpoint = str(tmp_path / "nowhere")
    with pytest.raises(schema.ConfigError, match="model.checkpoint: .* is not a directory"):
        schema.check_inputs(c)
    c.model.checkpoint = str(tmp_path)
    with pytest.raises(schema.ConfigError, match="holds no config.json"):
        schema.check_inputs(c)


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--config.grpo.group_size=1", "error: grpo.group_size: 1 is not an integer >= 2"),
        ("--config.train.micro_batches=5", "error: train.micro_batches: 5 does not divide"),
        (
            "--config.model.checkpoint=/nonexistent/qwen",
            "error: model.checkpoint: '/nonexistent/qwen' is not a directory",
        ),
    ],
)
def test_launch_main_refuses_in_one_line_and_writes_nothing(tmp_path, flag, message):
    workdir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "launch.main", "--config=configs/stage.py:smoke", f"--workdir={workdir}", flag],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1].startswith(message), out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert not workdir.exists()
    debug = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.main",
            "--config=configs/stage.py:smoke",
            f"--workdir={workdir}",
            flag,
            "--debug",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr and not workdir.exists()
