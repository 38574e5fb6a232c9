"""The GRPO phase of one stage: `train_stage(loop, run, trainer) -> run`.

The stage's EnvConfig (the last of `run.record.history`) gives a pool of certified boards (the
key (grpo_seed, 100, stage)), then `grpo.steps` GRPO steps (rl/step.py) from the cursor
`run.record.step`, each one unit of work (a stop inside a step's rollouts redoes the step on
resume), checkpointed every `checkpoint.every` steps; each step adds a point to the run's
trajectory (the engineer's account reads it, the statistics of the step's boards
under "env", step 0's the pool's boards replaced by the certified generator under "replaced") and
its scalars to TensorBoard. With `grpo.replay` > 0 each step also updates the replay buffer of
learnable boards (rl/replay.py) that the run's record carries from step to step and stage to stage.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from t2t_jax.engineer.context import board_sums
from t2t_jax.env import io
from t2t_jax.env.config import EnvConfig
from t2t_jax.rl import replay, sft
from t2t_jax.rl.rewards import TERMS
from t2t_jax.rl.step import StepSettings, grpo_step, trajectory_point
from t2t_jax.runrecord import RunState


def train_stage(loop, run: RunState, trainer) -> RunState:
    """GRPO steps `run.record.step` .. `grpo.steps` - 1 of stage `run.record.stage`."""
    c, s = loop.config, run.record.stage
    settings = StepSettings.from_config(c)
    env_config = EnvConfig.from_json(run.record.history[-1])
    need = c.grpo.steps * c.grpo.prompts * (1 + c.grpo.dynamic_sampling_rounds)
    pool, replaced = loop.guard(run, lambda: loop.draw(env_config, loop.grpo_key(100, s), need))
    if c.grpo.guidance == "canonical":
        pool = sft.canonical_plans(pool, env_config.max_size, env_config.max_agents)
    start = run.record.step
    for step in tqdm(
        range(start, c.grpo.steps), desc=f"stage {s}", disable=not loop.progress, initial=start, total=c.grpo.steps
    ):
        run = loop.guard(run, lambda: _step(loop, run, trainer, settings, pool, step, env_config, replaced))
        if (step + 1) % c.checkpoint.every == 0 and step + 1 < c.grpo.steps:
            run = loop.save(run)
    return run


def _step(
    loop, run: RunState, trainer, settings: StepSettings, pool, step: int, env_config: EnvConfig, replaced: dict
) -> RunState:
    c, s = loop.config, run.record.stage
    global_step = s * c.grpo.steps + step
    weights = run.record.weights[-1]
    state, ro, drawn, metrics = grpo_step(
        loop.policy, trainer, settings, run.train, run.ref, pool, step, weights, global_step, run.record.replay
    )
    g = c.grpo.group_size
    buffer = replay.update(settings.replay, run.record.replay, drawn.boards[::g], drawn.terms["valid"], g, global_step)
    log_step(loop.writer, global_step, ro, drawn, metrics, env_config, c.logging.text_every)
    trained = board_sums(ro.boards[::g])  # (one row per group: its board)
    point = {"stage": s, "step": step, **trajectory_point(drawn, metrics), "env": trained}
    if step == 0:  # (the pool's: per bucket, boards the certified generator generated and replaced)
        point["replaced"] = replaced
    return run.replace(train=state, step=step + 1, trajectory=[*run.record.trajectory, point], replay=buffer)


def log_step(writer, step: int, ro, drawn, metrics: dict, env_config: EnvConfig, text_every: int) -> None:
    """Scalars of one update: `reward/*` are the policy's own samples as drawn (every round,
    before selection), `selected/*` the batch the update trained on (guided rows excluded);
    two samples as text every `text_every` steps."""
    values = {f"train/{k}": v for k, v in metrics.items() if k != "bad_in_a_row"}
    for prefix, rows in (("reward", drawn), ("selected", ro.select(np.flatnonzero(~ro.guided)))):
        values.update({f"{prefix}/{t}": float(np.mean(rows.terms[t])) for t in TERMS})
        values[f"{prefix}/total"] = float(np.mean(rows.rewards))
    values["completion/mean_tokens"] = float(np.mean(drawn.lengths))
    values["completion/truncated"] = float(np.mean(drawn.truncated))
    buckets = np.array([b.get("bucket", 0) for b in drawn.boards])
    for i in range(len(env_config.buckets)):
        rows = buckets == i
        if rows.any():
            values[f"bucket_{i}/valid"] = float(drawn.verdicts.valid[rows].mean())
            values[f"bucket_{i}/optimal"] = float(drawn.verdicts.optimal[rows].mean())
    writer.scalars(step, values)
    if step % text_every == 0:
        writer.text(
            step,
            "samples",
            "\n\n".join(f"{io.board_text(b)}\n--> {t}" for b, t in zip(drawn.boards[:2], drawn.texts[:2])),
        )
