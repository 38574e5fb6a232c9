"""The whole loop with the shrunken embedded default (`configs/stage.py:smoke`): stages run,
proposals are recorded, the tables are written, and a run killed mid-stage (SIGKILL) or
preempted (SIGTERM) resumes to the same parameters as an uninterrupted run. Slow, the whole
module: its module runs (`run`, `checked`) are built once for all its tests, in the slow set
(CI runs `-m "slow and not long"`)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import free_port
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}
CACHE = ""  # set by the compilation_cache fixture
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """One persistent compilation cache for this module's runs: the first run compiles, the
    others (resume, eval, kill tests) reuse it."""
    global CACHE
    CACHE = str(tmp_path_factory.mktemp("jax_cache"))


def launch(workdir, *extra, wait=True):
    cmd = [
        sys.executable,
        "-m",
        "launch.main",
        "--config=configs/stage.py:smoke",
        f"--workdir={workdir}",
        "--noprogress",
        f"--config.compilation_cache={CACHE}",
        *extra,
    ]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def final_params(workdir):
    from t2t_jax.stages import StageRunner

    return jax.tree.map(np.asarray, StageRunner.from_workdir(str(workdir)).latest_params())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run")
    return workdir, launch(workdir)


def test_full_run_writes_everything(run):
    workdir, stdout = run
    results = json.load(open(workdir / "results.json"))
    assert [r["point"] for r in results] == ["warm_start", "stage_0", "stage_1"]
    for r in results:
        assert 0 <= r["valid"] <= 1 and 0 <= r["optimal"] <= r["valid"] + 1e-9
        assert {(c["agents"], c["size"]) for c in r["cells"]} == (
            {(3, n) for n in range(3, 11)} | {(4, n) for n in range(4, 11)} | {(5, n) for n in range(5, 11)}
        )
    assert results[0]["boards"] == results[-1]["boards"]  # first and last: the same boards
    assert all(len(r["board_valid"]) == r["boards"] for r in results)
    change = results[-1]["vs_first"]
    assert change["against"] == "warm_start" and "stage_1 vs warm_start on the same" in stdout
    assert 0 < change["p_value"] <= 1 and "exact McNemar p =" in stdout
    # The monitor: the same 8 boards at every point, 2 samples each, paired against the warm start.
    monitors = [r["monitor"] for r in results]
    assert all(m["k"] == 2 and m["boards"] == 8 and len(m["board_valid_counts"]) == 8 for m in monitors)
    assert all(0 <= m["avg_valid"] <= m["pass_valid"] <= 1 for m in monitors)
    paired = results[-1]["monitor_vs_first"]
    assert paired["against"] == "warm_start" and paired["boards"] == 8 and 0 < paired["p_value"] <= 1
    assert "monitor, stage_1 vs warm_start on the same 8 boards (avg@2 valid" in stdout
    first, last = (r["board_valid"].count("1") for r in (results[0], results[-1]))
    assert last - first == change["gained"] - change["lost"]
    records = [json.loads(line) for line in open(workdir / "proposals.jsonl")]
    assert len(records) == 1 and records[0]["kind"] == "self" and records[0]["prompt"]
    assert {"text", "parsed", "accepted", "reason", "config", "reward_weights"} <= set(records[0])
    table = open(workdir / "results_table.md").read()
    assert "Qwen3-4B + GRPO + Ours" in table and "| ours |" in table and "Sum acc." in table
    assert (workdir / "heatmap.png").stat().st_size > 0 and (workdir / "results_table.csv").exists()
    # The last point scores the out-of-distribution sets too (1 board per cell in the smoke run).
    ood = results[-1]["ood"]
    assert {n: [(c["agents"], c["size"]) for c in e["cells"]] for n, e in ood.items()} == {
        "ood_6_agents": [(6, n) for n in range(6, 11)],
        "ood_dense": [(5, n) for n in range(5, 11)],
    }
    assert "ood" not in results[0] and "### ood_6_agents" in table and "### ood_dense" in table
    # The engineer read the breakdown and the stage's training trajectory.
    assert "Worst cells" in records[0]["prompt"] and "Training: " in records[0]["prompt"]
    assert "=== stage 0" in stdout and "engineer (self)" in stdout
    acc = EventAccumulator(str(workdir / "tb"))
    acc.Reload()
    tags = acc.Tags()
    for tag in (
        "reward/valid",
        "reward/format",
        "selected/valid",
        "selected/total",
        "train/kl",
        "train/clip_low",
        "train/entropy",
        "train/grad_norm",
        "train/learning_rate",
        "train/tokens_per_s",
        "train/sampler_logratio",
        "train/sampler_logratio_max",
        "train/informative_groups",
        "train/no_signal",
        "completion/mean_tokens",
        "bucket_0/valid",
        "benchmark/valid",
        "monitor/avg_valid",
        "ood/ood_dense/valid",
        "sft/nll",
        "time/stage_s",
        "time/generation_s",
        "time/generation_tokens_per_s",
        "time/update_tokens_per_s",
        "time/certification_s",
        "time/evaluation_s",
        "time/engineer_s",
    ):
        assert tag in tags["scalars"], tag
    # Where the time went: the phases never overlap, so they sum to at most the stage's wall time.
    phases = [t for t in tags["scalars"] if re.fullmatch(r"time/[a-z]+_s", t) and t != "time/stage_s"]
    spent = {}
    for tag in phases:
        for e in acc.Scalars(tag):
            spent[e.step] = spent.get(e.step, 0.0) + e.value
    stages = {e.step: e.value for e in acc.Scalars("time/stage_s")}
    assert len(stages) == 2 and all(0 < spent[step] <= total + 1e-6 for step, total in stages.items())
    assert re.search(r"time: generation \d+ s \([\d,]+ tok/s\), certification \d+ s, scoring \d+ s, ", stdout), stdout
    assert "samples" in tags["tensors"] and "engineer/proposal" in tags["tensors"]
    assert "failures" in tags["images"]
    assert os.listdir(CACHE)  # the run filled the persistent compilation cache


def test_sampler_and_trainer_log_probs_agree(run):
    """Same tokens, same temperature: the sampler's log-probs are the trainer's (rounding only)."""
    acc = EventAccumulator(str(run[0] / "tb"))
    acc.Reload()
    assert all(e.value < 1e-3 for e in acc.Scalars("train/sampler_logratio_max"))


def test_existing_workdir_needs_resume(run):
    workdir, _ = run
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.main",
            "--config=configs/stage.py:smoke",
            f"--workdir={workdir}",
            "--noprogress",
            f"--config.compilation_cache={CACHE}",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode != 0 and "pass --resume" in out.stderr


def test_kl_run_resumes_from_an_sft_checkpoint_and_a_changed_beta_is_named(tmp_path):
    """With grpo.beta > 0 the reference params join the checkpoints at the GRPO phase: a resume
    from an SFT checkpoint restores without them, and a resume that changes beta says so."""
    import shutil

    launch(tmp_path, "--config.grpo.beta=0.04", "--config.stages=0")  # checkpoints 1 (SFT step 1), 2 (warm)
    shutil.rmtree(tmp_path / "checkpoints" / "2")
    stdout = launch(tmp_path, "--resume", "--config.grpo.beta=0.04", "--config.stages=1")
    assert "resumed from checkpoint 1: phase sft" in stdout and "=== stage 0" in stdout
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.main",
            "--config=configs/stage.py:smoke",
            f"--workdir={tmp_path}",
            "--noprogress",
            f"--config.compilation_cache={CACHE}",
            "--resume",
            "--config.stages=2",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 2 and "changes the run's maths: grpo.beta: 0.04 -> 0.0" in out.stderr, out.stderr[-3000:]
    # Allowed explicitly, the checkpoint restores with its reference model (kept, unused at beta 0).
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.main",
            "--config=configs/stage.py:smoke",
            f"--workdir={tmp_path}",
            "--noprogress",
            f"--config.compilation_cache={CACHE}",
            "--resume",
            "--config.stages=1",
            "--allow_changes=grpo.beta",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0 and "resumed from checkpoint" in out.stdout, out.stderr[-3000:]
    # The other way round the checkpoint refuses: a run begun at beta = 0 kept no reference model.
    plain = tmp_path.parent / (tmp_path.name + "_plain")
    launch(plain, "--config.stages=0")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.main",
            "--config=configs/stage.py:smoke",
            f"--workdir={plain}",
            "--noprogress",
            f"--config.compilation_cache={CACHE}",
            "--resume",
            "--config.stages=1",
            "--config.grpo.beta=0.04",
            "--allow_changes=grpo.beta",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode != 0 and "grpo.beta: 0.04 on resume" in out.stderr, out.stderr[-3000:]


def _kill_after_checkpoint(workdir, sig, checkpoint, *extra):
    proc = launch(workdir, *extra, wait=False)
    target = workdir / "checkpoints" / str(checkpoint)
    deadline = time.time() + 600
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    proc.send_signal(sig)
    return proc.wait(timeout=300), proc.stdout.read()


def test_sigkill_mid_stage_then_resume_equals_uninterrupted(run, tmp_path):
    workdir, _ = run
    # checkpoints of the smoke run: 1 sft step 1, 2 warm start, 3 stage 0 step 1 (then step 2
    # runs), 4 end of stage 0, 5 stage 1 step 1, 6 end of stage 1: killed inside stage 0
    code, _ = _kill_after_checkpoint(tmp_path, signal.SIGKILL, 3)
    assert code == -signal.SIGKILL
    stdout = launch(tmp_path, "--resume")
    assert "resumed from checkpoint" in stdout
    ours, reference = final_params(tmp_path), final_params(workdir)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference)):
        np.testing.assert_array_equal(a, b)
    assert json.load(open(tmp_path / "results.json")) == json.load(open(workdir / "results.json"))


# The warm-start check on the smoke run, set so that it never passes: 2 SFT steps, then two extra
# rounds of 2 steps on straight targets (checkpoints: 1 SFT step 1, 2 round 1 step 1, 3 round 2
# step 1, 4 the warm start).
CHECK = (
    "--config.stages=0",
    "--config.sft.check_boards=4",
    "--config.sft.check_samples=2",
    "--config.sft.min_valid=1.0",
    "--config.sft.extra_steps=2",
    "--config.sft.extra_rounds=2",
    "--config.sft.extra_targets=straight",
)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("checked")
    return workdir, launch(workdir, *CHECK)


def test_warm_start_check_adds_sft_rounds_until_they_run_out(checked):
    workdir, stdout = checked
    checks = json.load(open(workdir / "results.json"))[0]["sft_checks"]
    assert [(c["round"], c["steps"], c["boards"], c["k"], c["passed"]) for c in checks] == [
        (0, 2, 4, 2, False),
        (1, 4, 4, 2, False),
        (2, 6, 4, 2, False),
    ]
    assert all(0 <= c["avg_valid"] <= c["pass_valid"] <= 1 for c in checks)
    assert re.search(
        r"sft check after 2 steps: avg@2 valid [\d.]+ on 4 boards of env.initial \(sft.min_valid 1.0\); "
        r"another 2 steps \(round 1 of 2\)",
        stdout,
    ), stdout
    assert "another 2 steps (round 2 of 2)" in stdout and "round 3" not in stdout
    assert re.search(r"sft: \d+ of 64 boards have a valid straight plan \(sft.extra_targets='straight'\)", stdout)
    assert stdout.count("below sft.min_valid") == 3  # launch.main's summary, one line a check
    acc = EventAccumulator(str(workdir / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("sft/nll")] == list(range(6))
    assert [e.step for e in acc.Scalars("sft/check_avg_valid")] == [2, 4, 6]
    rates = {e.step: e.value for e in acc.Scalars("sft/learning_rate")}
    assert rates[2] == rates[4] == rates[0] < rates[1]  # each round restarts the warmup


def test_warm_start_check_resumes_mid_round_and_a_passing_check_changes_nothing(checked, tmp_path):
    workdir, _ = checked
    code, _ = _kill_after_checkpoint(tmp_path / "killed", signal.SIGKILL, 2, *CHECK)
    assert code == -signal.SIGKILL
    assert "resumed from checkpoint" in launch(tmp_path / "killed", "--resume", *CHECK)
    for a, b in zip(jax.tree.leaves(final_params(tmp_path / "killed")), jax.tree.leaves(final_params(workdir))):
        np.testing.assert_array_equal(a, b)
    assert json.load(open(tmp_path / "killed" / "results.json")) == json.load(open(workdir / "results.json"))
    # A check that passes at once leaves the warm start as it is without one.
    launch(tmp_path / "passed", "--config.stages=0", "--config.sft.check_boards=4", "--config.sft.min_valid=0.0")
    launch(tmp_path / "plain", "--config.stages=0")
    for a, b in zip(
        jax.tree.leaves(final_params(tmp_path / "passed")), jax.tree.leaves(final_params(tmp_path / "plain"))
    ):
        np.testing.assert_array_equal(a, b)
    passed, plain = (json.load(open(tmp_path / d / "results.json")) for d in ("passed", "plain"))
    assert [c["passed"] for c in passed[0].pop("sft_checks")] == [True] and passed == plain


def test_eval_cli_on_the_run(run, tmp_path):
    workdir, _ = run
    before = {os.path.join(r, p): os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(workdir) for p in fs}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.eval",
            f"--run={workdir}",
            "--per_cell=1",
            f"--out={tmp_path}",
            "--batch_size=32",
            "--samples=2",
            "--temperature=0.7",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["boards"] == 21 and os.path.exists(summary["md"])
    final = json.load(open(workdir / "results.json"))[-1]
    assert abs(summary["valid"] - final["valid"]) < 1e-9  # the same boards, the same greedy policy
    assert 0 <= summary["avg@2_valid"] <= summary["pass@2_valid"] <= 1
    assert "| avg@2 acc. |" in open(summary["md"]).read()
    assert set(summary["ood"]) == {"ood_6_agents", "ood_dense"}
    assert summary["ood"]["ood_dense"]["valid"] == final["ood"]["ood_dense"]["valid"]  # per_cell 1, like the run
    # Reading the run wrote nothing into it (no config.json rewrite, no new event file).
    assert {
        os.path.join(r, p): os.path.getmtime(os.path.join(r, p)) for r, _, fs in os.walk(workdir) for p in fs
    } == before
    bad = subprocess.run(
        [sys.executable, "-m", "launch.eval", f"--run={workdir}", "--samples=2", "--top_p=1.5"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode != 0 and "--top_p 1.5 must be" in bad.stderr


@pytest.fixture(scope="module")
def served(run):
    """`launch.serve` on the smoke run's latest checkpoint, as a process: its /v1 URL."""
    import urllib.request

    workdir, _ = run
    port = free_port()
    log = open(workdir.parent / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.serve", f"--run={workdir}", f"--port={port}", "--name=smoke"],
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None and time.time() < deadline, open(log.name).read()[-3000:]
            try:
                models = json.load(urllib.request.urlopen(url + "/models", timeout=5))
                break
            except OSError:
                time.sleep(0.5)
        assert [m["id"] for m in models["data"]] == ["smoke"]
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_eval_through_the_served_run_gives_the_in_process_verdicts(run, served, tmp_path):
    """launch.serve + launch.eval --api_base: the same per-board verdicts as the run's own
    greedy evaluation of its last checkpoint (benchmark and an OOD set), with token usage."""
    workdir, _ = run
    config = json.load(open(workdir / "config.json"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.eval",
            f"--api_base={served}",
            "--model=smoke",
            "--per_cell=1",
            f"--prompt_style={config['rollout']['prompt_style']}",
            f"--max_new_tokens={config['rollout']['max_new_tokens']}",
            "--ood=ood_dense",
            f"--out={tmp_path}",
            "--concurrency=4",
        ],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    final = json.load(open(workdir / "results.json"))[-1]
    table = json.load(open(tmp_path / "results_table.json"))
    assert table["board_valid"] == final["board_valid"]
    assert summary["ood"]["ood_dense"]["valid"] == final["ood"]["ood_dense"]["valid"]
    usage = summary["usage"]
    assert usage["requests"] >= 21 and usage["errors"] == 0 and usage["completion_tokens"] > 0
    assert "API usage:" in open(tmp_path / "results_table.md").read()
    assert len(list((tmp_path / "api_cache").iterdir())) == usage["requests"]


def test_the_stage_loop_with_a_served_engineer(served, tmp_path):
    """engineer.kind=api against launch.serve: the proposal is decoded under the schema by the
    served model, recorded and checked like the in-process engineer's."""
    launch(
        tmp_path,
        "--config.engineer.kind=api",
        f"--config.engineer.api_base={served}",
        "--config.engineer.model=smoke",
    )
    (record,) = [json.loads(line) for line in open(tmp_path / "proposals.jsonl")]
    assert record["kind"] == "api" and record["text"] and record["reason"]
    json.loads(record["text"])  # decoded under the proposal schema by the server
    assert record["accepted"] or record["reason"].startswith("rejected: ")


def test_the_base_engineer_decodes_with_the_params_grpo_started_from(tmp_path):
    """engineer.kind=base keeps the post-warm-start params in the checkpoints (as `ref`, also at
    grpo.beta = 0), and a resumed runner hands exactly those to the engineer, not the random init."""
    from t2t_jax.stages import StageRunner

    launch(tmp_path, "--config.engineer.kind=base", "--config.stages=0")  # SFT, then the warm point
    runner = StageRunner.from_workdir(str(tmp_path))
    run = runner.restore(runner.ckpt.latest_intact())
    state, meta = run.train, run.record
    assert meta.phase == "grpo" and meta.has_ref and runner.keeps_ref
    base = runner.base_params(run)
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), base, state.params)
    assert all(jax.tree.leaves(same))  # the warm start's params: GRPO has not moved yet
    init = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), base, runner.trainer.initial_params)
    assert not all(jax.tree.leaves(init))


def test_sigterm_checkpoints_and_exits_cleanly(run, tmp_path):
    workdir, _ = run
    code, out = _kill_after_checkpoint(tmp_path, signal.SIGTERM, 5)
    assert code == 0, out[-3000:]
    launch(tmp_path, "--resume")
    for a, b in zip(jax.tree.leaves(final_params(tmp_path)), jax.tree.leaves(final_params(workdir))):
        np.testing.assert_array_equal(a, b)


def test_sigterm_inside_a_stage_end_checkpoints_within_one_batch_and_resumes_exactly(run, tmp_path, monkeypatch):
    """SIGTERM during stage 0's held-out evaluation: no further decode call, a checkpoint of the
    trained state with the stage's end still to do, exit status 0; the resume redoes that end
    and finishes with the parameters and results of the uninterrupted run."""
    import configs.stage
    from t2t_jax import rundir
    from t2t_jax.evaluation import benchmark
    from t2t_jax.stages import Preempted, StageRunner

    workdir, _ = run
    config = configs.stage.get_config("smoke")
    config.compilation_cache = CACHE
    rundir.open_run(str(tmp_path), config, resume=False).close()
    evaluate, decodes = benchmark.evaluate, []

    def signalled(policy, *args, desc="", **kwargs):
        if desc == "held-out 0":
            os.kill(os.getpid(), signal.SIGTERM)  # the runner's handler only sets a flag
        rollout = policy.rollout
        policy.rollout = lambda *a, **k: decodes.append(desc) or rollout(*a, **k)
        try:
            return evaluate(policy, *args, desc=desc, **kwargs)
        finally:
            policy.rollout = rollout

    monkeypatch.setattr(benchmark, "evaluate", signalled)
    runner = StageRunner(config, str(tmp_path), progress=False)
    with pytest.raises(Preempted) as stopped:
        runner.run()
    assert stopped.value.code == 0
    assert "held-out 0" not in decodes  # stopped before the evaluation's first batch
    meta = runner.ckpt.meta(runner.ckpt.latest())
    assert (meta["phase"], meta["stage"], meta["step"]) == ("grpo", 0, config.grpo.steps)
    assert [r["point"] for r in meta["results"]] == ["warm_start"] and not meta["accounts"]
    assert [r["point"] for r in json.load(open(tmp_path / "results.json"))] == ["warm_start"]

    monkeypatch.setattr(benchmark, "evaluate", evaluate)
    StageRunner(config, str(tmp_path), progress=False).run(resume=True)
    for a, b in zip(jax.tree.leaves(final_params(tmp_path)), jax.tree.leaves(final_params(workdir))):
        np.testing.assert_array_equal(a, b)
    assert json.load(open(tmp_path / "results.json")) == json.load(open(workdir / "results.json"))


def test_sigterm_inside_a_steps_rollouts_stops_the_engine_and_redoes_the_step(run, tmp_path, monkeypatch):
    """SIGTERM as stage 0's second GRPO step starts: its rollouts stop at the engine's next
    chunk (no decode call runs), the checkpoint holds the state after step 1 of 2, exit status 0;
    the resume redoes step 2 and ends with the uninterrupted run's parameters."""
    import configs.stage
    from t2t_jax import rundir
    from t2t_jax.rl import stage
    from t2t_jax.stages import Preempted, StageRunner

    workdir, _ = run
    config = configs.stage.get_config("smoke")
    config.compilation_cache = CACHE
    rundir.open_run(str(tmp_path), config, resume=False).close()
    runner = StageRunner(config, str(tmp_path), progress=False)
    step_fn, signalled = stage.grpo_step, []

    def step_then_signal(policy, trainer, c, state, ref, pool, step, *args):
        if step == 1 and not signalled:
            signalled.append(step)
            os.kill(os.getpid(), signal.SIGTERM)  # (the handler only sets a flag)
        return step_fn(policy, trainer, c, state, ref, pool, step, *args)

    monkeypatch.setattr(stage, "grpo_step", step_then_signal)
    with pytest.raises(Preempted) as stopped:
        runner.run()
    assert stopped.value.code == 0 and signalled == [1]
    assert runner.policy.sampler.stats == {"decode_calls": 0}  # the step's rollouts: not one decode chunk
    meta = runner.ckpt.meta(runner.ckpt.latest())
    assert (meta["phase"], meta["stage"], meta["step"]) == ("grpo", 0, 1)

    monkeypatch.setattr(stage, "grpo_step", step_fn)
    StageRunner(config, str(tmp_path), progress=False).run(resume=True)
    for a, b in zip(jax.tree.leaves(final_params(tmp_path)), jax.tree.leaves(final_params(workdir))):
        np.testing.assert_array_equal(a, b)
