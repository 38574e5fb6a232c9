"""Benchmark MAPF-FrozenLake: generation, validation and BFS against baselines in one run.

  python -m launch.bench_env                       # full: batches 256..16384
  python -m launch.bench_env --batches=256,1024 --pogema=false

Prints one JSON object per line with `name`, `batch`, `ours_per_s`, `baseline`,
`baseline_per_s`, `ratio` (ours / baseline). Baselines, measured in the same run:
- `python_reference`: the straightforward per-board NumPy/Python code of t2t_jax.env.reference
  (same board law for generation; the reference simulator for validation);
- `gymnasium_generate_random_map`: gymnasium's single-agent FrozenLake map generator at the
  same size and hole fraction (p = 1 - density), the map generator users know;
- `pogema_reset`: POGEMA instance construction (GridConfig + reset) at the same size, agents
  and density, run by --pogema_python, an interpreter of its own virtualenv (POGEMA pins
  numpy<=1.26 and gymnasium 0.28, which cannot install beside this project, so it is not an
  extra of pyproject.toml); the benchmark installs nothing: make that virtualenv once with
  `python3 -m venv ~/.cache/t2t_jax/pogema-venv && ~/.cache/t2t_jax/pogema-venv/bin/pip install
  pogema==1.4.0`; without it the row is skipped with a note;
- `dense_int_relaxation`: distance maps by relaxation on int grids vs our bit-packed BFS;
- `host_only_python_sat`: certified boards made one at a time on the host (the reference
  generator, then the SAT solver from the lower bound up, no device bounds), against the
  pipelined CertifiedGenerator (device generation + bounds, SAT only for the rest, in a pool).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time

import jax
import numpy as np
from absl import flags

from t2t_jax import cli
from t2t_jax.env import distances, io, reference, solver
from t2t_jax.env.certified import CertifiedGenerator
from t2t_jax.env.config import make_config
from t2t_jax.env.generator import Generator
from t2t_jax.env.types import ACTION_NAMES
from t2t_jax.env.validator import validate

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["256", "1024", "4096", "16384"], "Batch sizes.")
flags.DEFINE_integer(
    "baseline_boards", 300, "Boards each per-board baseline is timed on.", lower_bound=1, upper_bound=100_000
)
flags.DEFINE_integer("repeats", 3, "Timed repeats (the best is kept).", lower_bound=1, upper_bound=100)
flags.DEFINE_integer("horizon", 32, "Plan horizon for validation.", lower_bound=1, upper_bound=1024)
flags.DEFINE_bool("pogema", True, "Measure POGEMA (with --pogema_python).")
flags.DEFINE_integer(
    "certified_boards", 2048, "Boards for the end-to-end certified benchmark.", lower_bound=1, upper_bound=1_000_000
)
flags.DEFINE_string(
    "pogema_python",
    os.path.expanduser("~/.cache/t2t_jax/pogema-venv/bin/python"),
    "A Python interpreter with pogema installed (see the module docstring); absent: skipped.",
)
cli.int_list("batches", 1, 1 << 20)

CONFIGS = {
    "10x10_a5_h30": ([{"size": 10, "agents": 5, "hole_density": 0.3}], (10, 5, 0.3)),
    "10x10_a5_h50": ([{"size": 10, "agents": 5, "hole_density": 0.5}], (10, 5, 0.5)),
    "mixed_3-10_a2-5_h0-50": (
        [
            {"size": [3, 5], "agents": [2, 3], "hole_density": [0.0, 0.5]},
            {"size": [6, 10], "agents": [2, 5], "hole_density": [0.0, 0.5]},
        ],
        None,
    ),
}

POGEMA_SCRIPT = """
import sys, time
from pogema import pogema_v0, GridConfig
size, agents, density, n = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def make(i):
    env = pogema_v0(grid_config=GridConfig(size=size, num_agents=agents, density=density, seed=i,
                                           max_episode_steps=64))
    env.reset(seed=i)
make(0)
t = time.perf_counter()
for i in range(n):
    make(i + 1)
print(n / (time.perf_counter() - t))
"""


def best_time(fn, repeats):
    jax.block_until_ready(fn())  # compile / warm up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return min(times)


def per_board_rate(fn, n):
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t)


def emit(name, batch, ours, baseline, base, **extra):
    print(
        json.dumps(
            {
                "name": name,
                "batch": batch,
                "ours_per_s": round(ours, 1),
                "baseline": baseline,
                "baseline_per_s": round(base, 1),
                "ratio": round(ours / base, 2),
                **extra,
            }
        ),
        flush=True,
    )


def pogema_rate(size, agents, density, n):
    """Instances/s of POGEMA, or (None, reason)."""
    py = FLAGS.pogema_python
    if not os.path.exists(py):
        return None, (
            f"--pogema_python {py} does not exist; make it with `python3 -m venv DIR && "
            "DIR/bin/pip install pogema==1.4.0` (launch/bench_env.py)"
        )
    try:
        out = subprocess.run(
            [py, "-c", POGEMA_SCRIPT, str(size), str(agents), str(density), str(n)],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
        return float(out.stdout.strip().splitlines()[-1]), None
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        detail = getattr(e, "stderr", b"") or b""
        detail = detail.decode() if isinstance(detail, bytes) else detail
        return None, f"{type(e).__name__}: {detail.strip()[-300:]}"


def bench_generation(batches):
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    for name, (buckets, single) in CONFIGS.items():
        gen = Generator(make_config(buckets))
        key = jax.random.key(0)
        ours = {b: b / best_time(lambda b=b: gen(key, b), FLAGS.repeats) for b in batches}
        rows = []
        if single is not None:
            size, agents, density = single
            rng = random.Random(0)
            rows.append(
                (
                    "python_reference",
                    per_board_rate(lambda i: reference.generate(rng, size, agents, density), FLAGS.baseline_boards),
                )
            )
            rows.append(
                (
                    "gymnasium_generate_random_map",
                    per_board_rate(lambda i: generate_random_map(size, p=1 - density, seed=i), FLAGS.baseline_boards),
                )
            )
            if FLAGS.pogema:
                rate, why = pogema_rate(size, agents, density, FLAGS.baseline_boards)
                if rate is None:
                    print(
                        json.dumps({"name": f"generate_{name}", "baseline": "pogema_reset", "skipped": why}), flush=True
                    )
                else:
                    rows.append(("pogema_reset", rate))
        else:
            rng = random.Random(0)
            spec = make_config(buckets)

            def mixed(i):
                b = spec.buckets[rng.choices(range(len(spec.buckets)), spec.weights)[0]]
                reference.generate(rng, rng.randint(*b.size), rng.randint(*b.agents), rng.uniform(*b.hole_density))

            rows.append(("python_reference", per_board_rate(mixed, FLAGS.baseline_boards)))
        for batch in batches:
            for baseline, rate in rows:
                emit(f"generate_{name}", batch, ours[batch], baseline, rate)


def bench_validation(batches):
    config = make_config(CONFIGS["10x10_a5_h30"][0])
    gen = Generator(config)
    rng = np.random.default_rng(0)
    biggest = max(batches)
    boards = gen(jax.random.key(1), biggest)
    lengths = rng.integers(8, FLAGS.horizon + 1, (biggest, 5))
    actions = rng.integers(0, 5, (biggest, 5, FLAGS.horizon)).astype(np.int8)
    actions[np.arange(FLAGS.horizon)[None, None] >= lengths[..., None]] = 0
    plans = io.plans_from_lists(actions.tolist(), 5, FLAGS.horizon)
    items = io.boards_to_json(jax.tree.map(lambda x: x[: FLAGS.baseline_boards], boards))
    named = [[[ACTION_NAMES[a] for a in actions[i, j, : lengths[i, j]]] for j in range(5)] for i in range(len(items))]
    base = per_board_rate(lambda i: reference.simulate(items[i], named[i]), len(items))
    for batch in batches:
        sub_b = jax.tree.map(lambda x: x[:batch], boards)
        sub_p = jax.tree.map(lambda x: x[:batch], plans)
        rate = batch / best_time(lambda: validate(sub_b, sub_p), FLAGS.repeats)
        emit("validate_10x10_a5_h30", batch, rate, "python_reference", base, horizon=FLAGS.horizon)


def bench_distances(batches):
    gen = Generator(make_config(CONFIGS["10x10_a5_h30"][0]))
    boards = gen(jax.random.key(2), max(batches))
    bits, dense = jax.jit(distances.distance_maps), jax.jit(distances.distance_maps_dense)
    for batch in batches:
        free = boards.free()[:batch, None].repeat(5, 1)
        goals = boards.goals[:batch]
        ours = batch * 5 / best_time(lambda: bits(free, goals), FLAGS.repeats)
        base = batch * 5 / best_time(lambda: dense(free, goals), FLAGS.repeats)
        emit("distance_maps_10x10_h30", batch, ours, "dense_int_relaxation", base, unit="maps")


def bench_certified():
    buckets = [
        {"size": [3, 5], "agents": [2, 3], "hole_density": [0.0, 0.5]},
        {"size": [6, 10], "agents": [2, 5], "hole_density": [0.0, 0.5]},
        {"size": 10, "agents": 5, "hole_density": 0.5},
    ]
    config = make_config(buckets)
    num = FLAGS.certified_boards
    with solver.make_pool() as pool:
        gen = CertifiedGenerator(config, chunk=512, pool=pool)
        gen(jax.random.key(0), 512)  # compile, start the workers
        t = time.perf_counter()
        gen(jax.random.key(1), num)
        ours = num / (time.perf_counter() - t)
    stats = gen.last_stats.as_dict()
    rng = random.Random(0)

    def host_only(i):
        while True:
            b = config.buckets[rng.choices(range(len(buckets)), config.weights)[0]]
            board = reference.generate(rng, rng.randint(*b.size), rng.randint(*b.agents), rng.uniform(*b.hole_density))
            if solver.solve(board).optimal_makespan is not None:
                return

    base = per_board_rate(host_only, max(FLAGS.baseline_boards // 3, 20))
    emit(
        "certified_mixed_3-10_a2-5_h0-50",
        num,
        ours,
        "host_only_python_sat",
        base,
        device_fraction=round(stats["device_fraction"], 3),
        solver_median_s=round(stats["solver_median_s"], 4),
        solver_p95_s=round(stats["solver_p95_s"], 4),
        infeasible_fraction=round(stats["infeasible"] / stats["generated"], 4),
    )


def main(argv):
    del argv
    batches = [int(b) for b in FLAGS.batches]
    print(
        json.dumps(
            {
                "name": "platform",
                "backend": jax.default_backend(),
                "devices": len(jax.devices()),
                "cpus": os.cpu_count(),
            }
        ),
        flush=True,
    )
    bench_generation(batches)
    bench_validation(batches)
    bench_distances(batches)
    bench_certified()


if __name__ == "__main__":
    cli.run(main)
