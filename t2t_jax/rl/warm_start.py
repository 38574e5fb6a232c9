"""The SFT warm start as a phase of the stage loop: `warm_start(loop, run, trainers) -> run`.

    trainers = SftTrainers(model, config, mesh)       # the main round's trainer, then the extra rounds'
    run = warm_start(loop, run, trainers)              # run.record.phase == "sft" on entry

`sft.steps` updates on certified boards of `sft.env` (rl/sft.py), then, with the warm-start check
on (`sft.check_boards` > 0), up to `sft.extra_rounds` rounds of `sft.extra_steps` more (on
`sft.extra_targets`) while the check's avg@k valid (k = `sft.check_samples`, the rollout
temperature, on `sft.check_boards` boards of env.initial: their own draw, not the monitor's)
stays below `sft.min_valid`. Each extra round restarts warmup and cosine decay with a fresh
optimizer. The cursor (`sft_round`, `step`) and the checks (`sft_checks`) live in the RunRecord,
so a run resumes mid-round; round r > 0 draws its batches with the seed (seed, r).
"""

from __future__ import annotations

import dataclasses
import functools

from absl import logging
from tqdm import tqdm

from t2t_jax.env.config import EnvConfig
from t2t_jax.rl import sft
from t2t_jax.rl.trainer import OptimSettings, Trainer, TrainSettings
from t2t_jax.runrecord import RunState


def sft_optim(config, steps: int) -> OptimSettings:
    """The SFT optimizer settings: `optim` with the `sft` rate and warmup, decaying over `steps`."""
    s = config.sft
    return dataclasses.replace(
        OptimSettings.from_config(config.optim),
        learning_rate=s.learning_rate,
        warmup_steps=s.warmup_steps,
        decay_steps=max(steps, 1),
    )


class SftTrainers:
    """`trainers(r)`: the Trainer of SFT round r (0: `sft.steps` long; r > 0: `sft.extra_steps`),
    each built once, when first asked for."""

    def __init__(self, model, config, mesh=None):
        self.model, self.config, self.mesh = model, config, mesh

    @functools.cache  # noqa: B019 (one runner, two trainers at most)
    def _trainer(self, extra: bool) -> Trainer:
        s = self.config.sft
        optim = sft_optim(self.config, s.extra_steps if extra else s.steps)
        return Trainer(self.model, TrainSettings.from_config(self.config, optim), loss="sft", mesh=self.mesh)

    def __call__(self, sft_round: int) -> Trainer:
        return self._trainer(sft_round > 0)


def updates(s, rounds: int) -> int:
    """SFT updates in the first `rounds` rounds: `sft.steps`, then `sft.extra_steps` each."""
    return s.steps + (rounds - 1) * s.extra_steps if rounds else 0


def warm_start(loop, run: RunState, trainers: SftTrainers) -> RunState:
    """The SFT phase from the cursor of `run.record` to its end (see the module docstring)."""
    c, s = loop.config, loop.config.sft
    first = EnvConfig.from_json(c.env.initial)
    env = EnvConfig.from_json(s.env) if s.env else first
    boards = loop.guard(run, lambda: loop.boards(env, loop.key(7), s.boards))
    pools = functools.cache(lambda field: _pool(boards, field, s[field], env))
    check_boards = functools.cache(lambda: loop.boards(first, loop.key(8), s.check_boards))
    while True:
        r = run.record.sft_round
        run = _round(loop, run, trainers(r), pools("extra_targets" if r and s.extra_targets else "targets"))
        if not s.check_boards:
            return run
        if len(run.record.sft_checks) <= r:  # (a resume after the check skips it)
            run = loop.guard(
                run, lambda: run.replace(sft_checks=[*run.record.sft_checks, _check(loop, run, check_boards())])
            )
        check = run.record.sft_checks[r]
        more = not check["passed"] and r < s.extra_rounds
        then = f"; another {s.extra_steps} steps (round {r + 1} of {s.extra_rounds})"
        print(
            f"sft check after {check['steps']} steps: avg@{check['k']} valid {check['avg_valid']:.4f} on "
            f"{check['boards']} boards of env.initial (sft.min_valid {s.min_valid})" + (then if more else "")
        )
        if not more:
            if not check["passed"]:
                logging.warning(
                    "sft: the warm start stays below sft.min_valid after %d extra rounds; GRPO groups "
                    "will rarely hold a success (raise sft.extra_rounds or sft.steps)",
                    s.extra_rounds,
                )
            return run
        run = run.replace(sft_round=r + 1, step=0, train=trainers(r + 1).init(run.train.params))


def _pool(boards, field: str, targets: str, env: EnvConfig) -> list[dict]:
    """The SFT pool of `targets` (the value of `sft.<field>`) from the certified `boards`."""
    pool = sft.sft_targets(boards, targets, env.max_size, env.max_agents)
    if not pool:
        raise ValueError(
            f"sft.{field}={targets!r}: none of the {len(boards)} boards of sft.env has a valid "
            "straight plan; raise sft.boards or use 'canonical'"
        )
    if len(pool) < len(boards):
        print(f"sft: {len(pool)} of {len(boards)} boards have a valid straight plan (sft.{field}={targets!r})")
    return pool


def _round(loop, run: RunState, trainer: Trainer, boards: list[dict]) -> RunState:
    """SFT round `run.record.sft_round` from its step `run.record.step`, one update a unit
    (checkpointed every `checkpoint.every` updates)."""
    c, r = loop.config, run.record.sft_round
    steps = c.sft.steps if r == 0 else c.sft.extra_steps
    done = updates(c.sft, r)
    order = sft.batch_order(len(boards), c.sft.batch_size, steps, c.seed if r == 0 else [c.seed, r])

    def update(run, step):
        picked = [boards[i] for i in order[step]]
        state, metrics = sft.sft_update(trainer, run.train, loop.policy, picked, c.sft.answer_length)
        loop.writer.scalars(
            done + step, {f"sft/{k}": v for k, v in metrics.items() if k in ("nll", "grad_norm", "learning_rate")}
        )
        return run.replace(train=state, step=step + 1)

    start = run.record.step
    for step in tqdm(range(start, steps), desc="sft", initial=start, total=steps, disable=not loop.progress):
        run = loop.guard(run, lambda: update(run, step))
        if (step + 1) % c.checkpoint.every == 0 and step + 1 < steps:
            run = loop.save(run)
    return run


def _check(loop, run: RunState, boards: list[dict]) -> dict:
    """The warm-start check after round `run.record.sft_round` (see the module docstring)."""
    c, r = loop.config, run.record.sft_round
    k = c.sft.check_samples
    entry = loop.evaluator.sampled(run.train.params, boards, k, f"sft check {r}")
    steps = updates(c.sft, r + 1)
    loop.writer.scalars(steps, {"sft/check_avg_valid": entry["avg_valid"]})
    return {
        "round": r,
        "steps": steps,
        "boards": len(boards),
        "k": k,
        "avg_valid": entry["avg_valid"],
        "pass_valid": entry["pass_valid"],
        "passed": entry["avg_valid"] >= c.sft.min_valid,
    }
