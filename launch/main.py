"""The stage loop: `python -m launch.main --config=configs/stage.py --workdir=DIR [--resume]`.

Any config field is a flag: `--config.grpo.steps=20 --config.engineer.kind=frontier`.
Before any work every field is checked (t2t_jax/config/schema.py) and the run directory is opened
(t2t_jax/rundir.py: a fresh start needs a new directory, `--resume` refuses a change to the
run's maths unless named in `--allow_changes`, one process per directory). An expected error
is one line and exit status 2 (`--debug`: the traceback). See t2t_jax/stages.py for what a run
does and writes.
"""

from absl import flags, logging

from t2t_jax import cli

_CONFIG = cli.DEFINE_config_file("config", "configs/stage.py", "The run's config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Where checkpoints, logs and results go.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --workdir from its latest checkpoint.")
_ALLOW = flags.DEFINE_list(
    "allow_changes",
    [],
    "With --resume: config fields (or sections) of the run's maths "
    "that may differ from the run's; the changes are recorded in history.jsonl.",
)
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars.")
_BREAK_LOCK = flags.DEFINE_bool(
    "break_lock", False, "Take over the run directory's stale lock (one whose process is gone: its message says so)."
)


def main(argv):
    del argv
    if logging.get_verbosity() <= logging.INFO and not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
    import jax

    from t2t_jax import distributed, preemption, rundir
    from t2t_jax.config import schema

    preemption.route_to_a_thread()  # SIGTERM to one waiting thread, before any other thread exists

    schema.validate(_CONFIG.value)
    schema.check_inputs(_CONFIG.value)
    distributed.initialize(_CONFIG.value.distributed)  # before anything touches a device
    run = distributed.same_outcome(  # (a refusal on one host stops every host at once)
        lambda: rundir.open_run(
            _WORKDIR.value, _CONFIG.value, resume=_RESUME.value, allow=_ALLOW.value, break_lock=_BREAK_LOCK.value
        )
    )
    try:
        from t2t_jax.stages import StageRunner

        results = StageRunner(_CONFIG.value, _WORKDIR.value, progress=_PROGRESS.value).run(resume=_RESUME.value)
    except BaseException as e:
        run.close(failed=not isinstance(e, SystemExit) or e.code not in (0, None))
        if jax.process_count() > 1 and not isinstance(e, SystemExit):  # (a stop is agreed; an error is one host's)
            distributed.exit_alone(e)
        raise
    run.close()
    report(results)


def report(results) -> None:
    """The evaluation points and the last point's paired comparisons with the first."""
    for r in results:
        print(
            f"{r['point']:>12}: valid {r['valid']:.3f}  optimal {r['optimal']:.3f}  ({r['boards']} boards)"
            + (f"  monitor avg@{r['monitor']['k']} valid {r['monitor']['avg_valid']:.3f}" if "monitor" in r else "")
        )
        for check in r.get("sft_checks", []):
            print(
                f"{'':>12}  sft check after {check['steps']} steps: avg@{check['k']} valid {check['avg_valid']:.4f} "
                f"on {check['boards']} boards ({'passed' if check['passed'] else 'below sft.min_valid'})"
            )
    last = results[-1]
    if "vs_first" in last:
        d = last["vs_first"]
        print(
            f"benchmark, {last['point']} vs {d['against']} on the same {last['boards']} boards (greedy): "
            f"{d['gained']} gained, {d['lost']} lost, valid {d.get('diff', 0):+.4f} {d.get('ci95', '')} "
            f"(exact McNemar p = {d.get('p_value', float('nan')):.3f})"
        )
    if "monitor_vs_first" in last:
        d, m = last["monitor_vs_first"], last["monitor"]
        print(
            f"monitor, {last['point']} vs {d['against']} on the same {d['boards']} boards (avg@{m['k']} valid at "
            f"T={m['temperature']}): {d['diff']:+.4f}, 95% CI {d['ci95']} (paired permutation p = {d['p_value']:.4f})"
        )
    print(f"results: {_WORKDIR.value}/results.json, {_WORKDIR.value}/results_table.md")


if __name__ == "__main__":
    cli.run(main)
