"""Arms x seeds of the stage loop, one warm start per seed, and the study's report.

    python -m launch.study --config=configs/stage.py --seeds=0,1,2 --workdir=runs/study \
        --arms=grpo,shuffle,fixed,random,frontier,learnability [--reference=grpo] [--config.x=y ...]

For each seed, `launch.main --config.stages=0` runs the warm start once (DIR/warm_start/seed_S);
then every arm runs on a seed before the next seed (so a study stopped part-way holds whole sets of
paired runs), each run a copy of its seed's warm start resumed with the arm's overrides
(DIR/ARM/seed_S, its log beside it as seed_S.log). With `--grpo_seeds=0,1,...` each seed's warm
start gives one run per GRPO seed (`--config.grpo_seed=G`: the GRPO phase's and the curriculum's
randomness; DIR/ARM/seed_S_grpo_G, run `S.G` in the report): N runs of an arm from one warm start,
cheap replicates of the GRPO phase, while the warm start's own variance stays the factor `--seeds`.
`--config.key=value` flags go to every run. Runs execute one at a time as subprocesses; the study is
resumable: a finished run is kept, an interrupted one resumed. At the end
DIR/study.{md,csv,json,png} hold, for every comparison (each arm against its warm start and against
the reference), the primary test across training runs (the seeds' per-run differences on the same
boards: paired t, exact sign-flip, hierarchical bootstrap interval, and the runs needed for 80%
power at each of `--effects` points), then the arms' means over seeds and the board-pooled paired
tests, labelled as evaluation noise given the runs (t2t_jax/evaluation/study.py,
t2t_jax/evaluation/run_stats.py).

    python -m launch.study --merge=runs/study_s0,runs/study_s1 --workdir=runs/study_s01

runs nothing: it reports over the finished runs of several studies (one seed each, say, each run
on its own machine), for the arms that hold every seed of the reference arm; the arms of a seed
must share its warm start. Arms: grpo (the config as given), shuffle (grpo.control=shuffle),
self, fixed, random, frontier, learnability (engineer.kind), or name:key=value+key=value.
"""

import json
import os
import shutil
import subprocess
import sys
import time

from absl import app, flags

from t2t_jax import cli

_CONFIG = flags.DEFINE_string("config", "configs/stage.py", "The stage-loop config file of every run.")
_ARMS = flags.DEFINE_string("arms", "grpo,shuffle", "Comma-separated arms (see the module docstring).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; each has its own warm start.")
_GRPO_SEEDS = flags.DEFINE_list(
    "grpo_seeds",
    [],
    "GRPO seeds (config.grpo_seed): each seed's warm start gives one run per GRPO seed (empty: one run per seed).",
)
_WORKDIR = flags.DEFINE_string("workdir", "runs/study", "The study's directory.")
_REFERENCE = flags.DEFINE_string("reference", "", "The arm the others are compared with (default: the first).")
_DRY = flags.DEFINE_bool("dry_run", False, "Print the runs' commands and stop.")
_MERGE = flags.DEFINE_list("merge", [], "Study directories to report over together; runs nothing.")
_EFFECTS = flags.DEFINE_list(
    "effects", ["1", "2", "5"], "Differences (points, in (0, 100]) for which the report gives the runs needed."
)
cli.int_list("seeds", 0, 2**32 - 1)
cli.int_list("grpo_seeds", 0, 2**32 - 1)


def _effects_ok(values) -> bool:
    """Whether every --effects item is a number of points in (0, 100]."""
    try:
        return bool(values) and all(0 < float(v) <= 100 for v in values)
    except ValueError:
        return False


flags.register_validator("effects", _effects_ok, message="--effects: give comma-separated points in (0, 100]")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config_overrides(argv) -> list[str]:
    """The `--config.key=value` flags of this command line, forwarded to every run."""
    return [a for a in argv if a.startswith("--config.")]


def run_config(argv: list[str]):
    """The config one run's command line gives (its --config and --config.key=value flags)."""
    from absl import flags as absl_flags
    from ml_collections import config_flags

    argv = ["launch.main", *[a for a in argv if a.startswith("--config")]]
    values = absl_flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def run(cmd: list[str], log: str, label: str) -> None:
    """One launch.main run as a subprocess, its output in `log`; an error names the log."""
    started = time.time()
    print(f"{label}: running ({' '.join(cmd[2:])})", flush=True)
    with open(log, "a") as f:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if rc:
        raise RuntimeError(f"{label} failed (exit {rc}); its log: {log}")
    print(f"{label}: done in {time.time() - started:.0f} s", flush=True)


def report(root: str, results: dict, reference: str) -> None:
    """DIR/study.{md,csv,json} over results[arm][seed]; the Markdown is printed."""
    from t2t_jax.evaluation import study

    command = "python -m launch.study " + " ".join(a for a in sys.argv[1:])
    os.makedirs(root, exist_ok=True)
    effects = tuple(float(v) / 100 for v in _EFFECTS.value)
    paths = study.write_study(root, study.summarize(results, reference, effects), command)
    print(open(paths["md"]).read())
    print(json.dumps(paths))


def _own_report(root: str) -> bool:
    """Whether `root` holds the report of a study that ran there (not of a merge)."""
    try:
        with open(os.path.join(root, "study.json")) as f:
            return "--merge" not in json.load(f).get("command", "")
    except (OSError, ValueError):
        return False


def merge(directories: list[str], root: str) -> None:
    """The report over the finished runs of several studies (see the module docstring)."""
    from t2t_jax.evaluation import study

    if any(os.path.abspath(d) == root for d in directories) or _own_report(root):
        raise app.UsageError(f"--workdir: {root} holds a study's own runs or report; give a new directory")
    try:
        results = study.collect(directories)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    reference = _REFERENCE.value or ("grpo" if "grpo" in results else sorted(results)[0])
    if reference not in results:
        raise app.UsageError(f"--reference: {reference!r} is not one of the arms found {sorted(results)}")
    results, partial = study.complete_arms(results, reference)
    if partial:
        print(f"left out (not every seed of {reference!r}: {sorted(results[reference])}): {partial}", file=sys.stderr)
    report(root, results, reference)


def main(argv):
    from t2t_jax.evaluation import study

    if _MERGE.value:
        merge(_MERGE.value, os.path.abspath(_WORKDIR.value))
        return
    try:
        arms = study.parse_arms(_ARMS.value)
        seeds = [int(s) for s in _SEEDS.value]
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    reference = _REFERENCE.value or next(iter(arms))
    if reference not in arms:
        raise app.UsageError(f"--reference: {reference!r} is not one of the arms {list(arms)}")
    common = config_overrides(sys.argv[1:])
    root = os.path.abspath(_WORKDIR.value)
    base = [sys.executable, "-m", "launch.main", f"--config={_CONFIG.value}", "--noprogress"]
    # The warm starts first.
    warm = {s: os.path.join(root, "warm_start", f"seed_{s}") for s in seeds}
    plan = [
        (
            "warm_start",
            s,
            warm[s],
            None,
            base + [f"--workdir={warm[s]}", f"--config.seed={s}", *common, "--config.stages=0"],
        )
        for s in seeds
    ]
    grpo_seeds = [int(g) for g in _GRPO_SEEDS.value] or [None]
    # Run by run, every arm of a (seed, GRPO seed) before the next: a study stopped part way holds
    # whole sets of paired runs.
    for s in seeds:
        for g in grpo_seeds:
            for arm, overrides in arms.items():
                # The arm's own fields may differ from the warm start's (recorded in its history.jsonl).
                changed = [o.split("=", 1)[0] for o in overrides] + (["grpo_seed"] if grpo_seeds != [None] else [])
                allow = [f"--allow_changes={','.join(changed)}"] if changed else []
                workdir = os.path.join(root, arm, study.run_name(s, g))
                plan.append(
                    (
                        arm,
                        study.run_key(s, g),
                        workdir,
                        warm[s],
                        base
                        + [
                            f"--workdir={workdir}",
                            "--resume",
                            *allow,
                            f"--config.seed={s}",
                            *([f"--config.grpo_seed={g}"] if g is not None else []),
                            *common,
                            *(f"--config.{o}" for o in overrides),
                        ],
                    )
                )
    from t2t_jax.config import schema

    for arm, s, _, _, cmd in plan:  # every run's config, checked before any work
        message = cli.config_error(cmd)  # (the file, its argument, the override names)
        if message:
            raise schema.ConfigError(f"arm {arm!r}, seed {s}: {message}")
        try:
            schema.validate(run_config(cmd))
        except (schema.ConfigError, ValueError, flags.Error) as e:
            raise schema.ConfigError(f"arm {arm!r}, seed {s}: {e}") from None
    if _DRY.value:
        print("\n".join(" ".join(p[4]) for p in plan))
        return
    results = {arm: {} for arm in arms}
    os.makedirs(root, exist_ok=True)
    for i, (arm, s, workdir, warm, cmd) in enumerate(plan):
        label = f"[{i + 1}/{len(plan)}] {arm} seed {s}"
        if not study.finished(workdir):
            if warm is not None and not os.path.exists(workdir):  # a copy of the warm start, made whole first
                tmp = workdir + ".copying"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(warm, tmp, ignore=shutil.ignore_patterns(".lock"))
                os.replace(tmp, workdir)
            elif warm is None and os.path.exists(os.path.join(workdir, "config.json")):  # begun before
                cmd = cmd + ["--resume"]
            os.makedirs(os.path.dirname(workdir), exist_ok=True)
            run(cmd, workdir + ".log", label)
        else:
            print(f"{label}: finished before, kept", flush=True)
        if warm is not None:
            with open(os.path.join(workdir, "results.json")) as f:
                results[arm][s] = json.load(f)
    report(root, results, reference)


def parse_flags(argv):
    """absl parses the study's own flags; `--config.key=value` flags are the runs'."""
    return flags.FLAGS([a for a in argv if not a.startswith("--config.")])


if __name__ == "__main__":
    cli.run(main, flags_parser=parse_flags)
