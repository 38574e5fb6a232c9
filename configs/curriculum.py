"""The curriculum testbed (issue 32): the embedded default's model and warm start, trained from a
start off its competence frontier, scored on a target distribution no arm trains on.

    python -m launch.main --config=configs/curriculum.py --workdir=/tmp/cur          # one run
    python -m launch.main --config=configs/curriculum.py:short --workdir=/tmp/cur_s  # 2 stages

- `env.initial`: four buckets, most weight on boards the warm-started model cannot yet solve
  (3 agents on large dense maps, 4 agents), a little on boards it partly solves; `fixed` keeps
  training there, an adaptive curriculum can move the weight to where groups differ.
- `eval.target`: 256 boards of the benchmark's 3-agent distribution (sizes 3-10, holes up to
  50%), one fixed draw, avg@8 with its standard error at every point; the monitor (128 boards of
  env.initial, avg@8) stays a second number.
- 8 stages x 16 updates, one round of 16 boards x 8 samples per update, dynamic sampling off
  (on as an arm: `dynamic`), so the curriculum, not the sampler, picks the informative groups.

Arms (`launch.study --arms=...`; the names launch.study knows, or name:key=value+...):
    fixed, random, learnability, frontier      the baselines (engineer.kind); with four buckets
                                                learnability reweights (it is not fixed here)
    uniform                                     proposals drawn uniformly from the proposal schema
    scripted, scripted_rewrite                  the scripted evidence engineer (reads the failure
                                                breakdown; selective edits or a rewrite)
    scripted_nobreak:engineer.kind=scripted+engineer.breakdown_cells=0   (breakdown off)
    self                                        the policy as its own engineer
    replay                                      engineer.kind=fixed + grpo.replay=0.5: half of each
                                                batch replayed from the most learnable boards seen
                                                (PLR / SFL-style, rl/replay.py)
    dynamic:engineer.kind=fixed+grpo.dynamic_sampling=True+grpo.dynamic_sampling_rounds=3

The positive control first (fixed against one adaptive curriculum, 6 runs each from one warm
start; the command and its cost: docs/experiments.md, "The curriculum testbed").
"""

import json

from configs.stage import get_config as stage_config

# The benchmark's 3-agent distribution: what the curriculum should reach, never trained on.
TARGET = {
    "max_size": 10,
    "max_agents": 5,
    "buckets": [{"size": [3, 10], "agents": 3, "hole_density": [0.0, 0.5], "min_distance": 1}],
}

# Off the frontier: weight 1 on boards the warm start partly solves, 8 on boards it cannot.
INITIAL = {
    "max_size": 10,
    "max_agents": 5,
    "buckets": [
        {"size": [3, 5], "agents": 3, "hole_density": [0.0, 0.2], "min_distance": 1, "weight": 1.0},
        {"size": [6, 8], "agents": 3, "hole_density": [0.1, 0.3], "min_distance": 1, "weight": 2.0},
        {"size": [8, 10], "agents": 3, "hole_density": [0.3, 0.5], "min_distance": 1, "weight": 3.0},
        {"size": [5, 8], "agents": 4, "hole_density": [0.1, 0.3], "min_distance": 1, "weight": 3.0},
    ],
}


def get_config(arg: str = ""):
    c = stage_config()
    c.stages = 8
    c.env.initial = json.dumps(INITIAL)
    c.grpo.update(steps=16, dynamic_sampling=False, dynamic_sampling_rounds=0)
    c.optim.update(decay_steps=c.stages * c.grpo.steps)
    c.engineer.update(kind="fixed")
    c.eval.update(
        per_cell=30, mid_per_cell=4, monitor=128, monitor_samples=8, target=json.dumps(TARGET), target_boards=256
    )
    c.eval.update(target_samples=8, ood="")
    if arg == "short":  # the timing variant: two stages
        c.stages = 2
    elif arg:
        raise ValueError(f"configs/curriculum.py: unknown argument {arg!r} (known: short)")
    return c
