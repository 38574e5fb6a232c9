"""The embedded default: the tiny Qwen3 and the embedded tokenizer, no downloads, three stages
on a 2-core CPU in minutes.

    python -m launch.main --config=configs/stage.py --workdir=/tmp/t2t
    python -m launch.main --config=configs/stage.py:smoke --workdir=/tmp/t2t_smoke   # seconds
    python -m launch.main --config=configs/stage.py --config.engineer.kind=frontier --workdir=...

The tiny model starts from random weights, so an SFT warm start on certified optimal plans
(canonical straight plans where valid, see t2t_jax/rl/sft.py) comes first, with the `offsets`
prompt (the board and each agent's displacement). GRPO starts on 3-agent boards up to 5x5 and
2-agent ones up to 4x4; the benchmark points use a fixed subset (30 boards per cell at the first
and last point, 6 between).
"""
import json

from configs.common import base


def get_config(arg: str = ""):
    c = base()
    # Rollouts at T = 0.7 (the policy's log-probs at the same temperature): at T = 1 the tiny
    # model's samples are mostly invalid even where its greedy plan is valid, and groups rarely
    # hold a success to learn from.
    c.rollout.update(max_new_tokens=64, prompt_style="offsets", temperature=0.7)
    c.train.update(temperature=0.7)
    # 3-agent boards (the benchmark's smallest agent count) where the warm start has some
    # valid plans, and 2-agent boards where it has more.
    c.env.initial = json.dumps({"max_size": 10, "max_agents": 5, "buckets": [
        {"size": [3, 5], "agents": 3, "hole_density": [0.0, 0.3], "min_distance": 1, "weight": 2.0},
        {"size": [3, 4], "agents": 2, "hole_density": [0.0, 0.3], "min_distance": 1, "weight": 1.0}]})
    c.sft.update(steps=600, batch_size=16, boards=4096, learning_rate=3e-3, warmup_steps=10,
                 targets="canonical", answer_length=48,
                 env=json.dumps({"max_size": 10, "max_agents": 5, "buckets": [
                     {"size": [3, 6], "agents": [2, 3], "hole_density": [0.0, 0.4], "min_distance": 1}]}))
    c.grpo.update(steps=24, prompts=4, group_size=8, loss_type="dapo", beta=0.0)
    c.optim.update(learning_rate=3e-5, warmup_steps=4, decay_steps=72)
    c.engineer.update(failure_cases=2)
    c.eval.update(per_cell=30, mid_per_cell=6, heldout=32, batch_size=64)
    c.checkpoint.update(every=50)
    if arg == "smoke":  # the test suite's run: every phase, in seconds
        c.stages = 2
        c.env.update(chunk=64)  # boards per device call of the certified generator
        c.sft.update(steps=2, batch_size=4, boards=64)
        c.grpo.update(steps=2, prompts=2, group_size=2)
        c.engineer.update(failure_cases=1, max_edits=1, max_tokens=200)
        c.eval.update(per_cell=1, mid_per_cell=1, heldout=8, batch_size=16)
        c.checkpoint.update(every=1)
        c.logging.update(text_every=1)
    elif arg:
        raise ValueError(f"configs/stage.py: unknown argument {arg!r} (known: smoke)")
    return c
