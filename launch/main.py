"""The stage loop: `python -m launch.main --config=configs/stage.py --workdir=DIR [--resume]`.

Any config field is a flag: `--config.grpo.steps=20 --config.engineer.kind=frontier`.
See t2t_jax/stages.py for what a run does and writes.
"""
if __name__ == "__main__":  # restart with the malloc tunable before jax loads: t2t_jax/hostenv.py
    from t2t_jax import hostenv
    hostenv.reexec_with_malloc_tunables()

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", "configs/stage.py", "The run's config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Where checkpoints, logs and results go.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --workdir from its latest checkpoint.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars.")


def main(argv):
    del argv
    if logging.get_verbosity() <= logging.INFO and not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO
    from t2t_jax.stages import StageRunner
    results = StageRunner(_CONFIG.value, _WORKDIR.value, progress=_PROGRESS.value).run(resume=_RESUME.value)
    for r in results:
        print(f"{r['point']:>12}: valid {r['valid']:.3f}  optimal {r['optimal']:.3f}  ({r['boards']} boards)")
        if "vs_first" in r:
            d = r["vs_first"]
            print(f"{'':>12}  vs {d['against']} on the same boards: {d['gained']} gained, {d['lost']} lost "
                  f"(exact McNemar p = {d.get('p_value', float('nan')):.3f})")
    print(f"results: {_WORKDIR.value}/results.json, {_WORKDIR.value}/results_table.md")


if __name__ == "__main__":
    app.run(main)
