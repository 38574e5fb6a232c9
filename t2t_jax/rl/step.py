"""One GRPO step of the stage loop, apart from the loop's bookkeeping.

    settings = StepSettings.from_config(config)
    out = grpo_step(policy, trainer, settings, state, ref, boards, step, weights, global_step, buffer)
    out.state, out.rollouts, out.drawn, out.metrics

The step: up to 1 + `grpo.dynamic_sampling_rounds` rounds of `grpo.prompts` boards x
`grpo.group_size` samples (round r of step s takes boards[(s * rounds + r) * prompts:][:prompts],
with `grpo.replay` of them replaced by boards of the replay buffer: rl/replay.py), each round
optionally guided (a certified plan in place of a sample in groups without a
success); dynamic sampling keeps the groups whose accuracy differs (`grpo.select_groups`) and
fills the batch at advantage 0; no update when no group differs; advantages
(`grpo.batch_advantages`, the shuffle control among them), old log-probs from the sampler or
recomputed, reference log-probs when `grpo.beta` > 0, then `grpo.num_iterations` updates.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from t2t_jax import fields
from t2t_jax.models.qwen3.presets import Qwen3Config
from t2t_jax.perf import PhaseTimer, model_flops
from t2t_jax.rl import grpo, replay
from t2t_jax.rollout import Rollouts, concat, guide

GUIDANCE = ("none", "witness", "canonical")  # grpo.guidance
OLD_LOGPROBS = ("recompute", "sampler")  # grpo.old_logprobs


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """What one GRPO step reads of the config: the `grpo` section's batch, selection, guidance
    and advantage settings, the replay of learnable boards (`grpo.replay*`), the rollout's
    decoding (`rollout.*`) and the GRPO phase's seed (`grpo_seed`, default the run's seed: the
    sampling seed of each round, the replay draw's and the shuffle control's). The schema checks
    the values
    (`GUIDANCE`, `OLD_LOGPROBS`: legal values this module owns)."""

    prompts: int
    group_size: int
    dynamic_sampling: bool
    dynamic_sampling_rounds: int
    informative: str
    guidance: str
    scale_rewards: str
    control: str
    old_logprobs: str
    num_iterations: int
    beta: float
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    replay: replay.ReplaySettings = replay.ReplaySettings()

    @classmethod
    def from_config(cls, config) -> StepSettings:
        """The slice of a run config (`grpo`, `rollout`, `grpo_seed`)."""
        g, r = config.grpo, config.rollout
        names = {f.name for f in dataclasses.fields(cls)} - {"replay"}
        return cls(
            **{k: g[k] for k in names if k in g},
            **{k: r[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p")},
            seed=fields.grpo_seed(config),
            replay=replay.ReplaySettings.from_config(config),
        )

    @property
    def rounds(self) -> int:
        """Sampling rounds a step may take (one without dynamic sampling)."""
        return 1 + self.dynamic_sampling_rounds if self.dynamic_sampling else 1


class StepOutput(NamedTuple):
    state: Any  # the train state after the update (unchanged when there was none)
    rollouts: Rollouts  # the batch the update trained on (after selection and guidance)
    drawn: Rollouts  # every sample the policy drew this step, before selection and guidance
    metrics: dict  # the update's metrics, plus guided, informative_groups, replayed, no_signal, tokens_per_s


def trajectory_point(drawn: Rollouts, metrics: dict) -> dict:
    """One step in brief for the engineer's account (engineer/context.py TRAJECTORY): the
    policy's own samples (reward, valid rate, completion tokens, how many were drawn), the share
    of informative groups over its rounds and of replayed ones (rl/replay.py), and the update's
    entropy, KL and clip fractions (None without an update)."""
    return {
        "reward": float(np.mean(drawn.rewards)),
        "valid": float(np.mean(drawn.terms["valid"])),
        "tokens": float(np.mean(drawn.lengths)),
        "samples": len(drawn.texts),
        "informative_groups": metrics.get("informative_groups"),
        "replayed": metrics.get("replayed", 0.0),
        **{k: metrics.get(k) for k in ("entropy", "kl", "clip_low", "clip_high")},
        "no_signal": bool(metrics.get("no_signal", 0.0)),
    }


def sample_rounds(
    policy, g: StepSettings, params, boards: Sequence[dict], step: int, weights, global_step: int, buffer=()
):
    """(rounds after guidance, rounds as drawn, [G] informative mask per round, [G] mask per round
    of the groups replayed from `buffer`, never a board twice in a step): rounds stop once
    `grpo.prompts` informative groups were found (one round without dynamic sampling)."""
    p, per_step = g.prompts, 1 + g.dynamic_sampling_rounds
    rounds, drawn, informative, replayed, taken = [], [], [], [], set()
    for round_ in range(g.rounds):
        start = (step * per_step + round_) * p
        fresh, seed = boards[start : start + p], (g.seed, global_step, round_)
        chosen, k = replay.mix(g.replay, buffer, fresh, seed, global_step, frozenset(taken))
        taken.update(replay.key(b) for b in chosen[:k])
        replayed.append(np.arange(len(chosen)) < k)
        ro = policy.rollout(
            params,
            chosen,
            n=g.group_size,
            max_new_tokens=g.max_new_tokens,
            reward_weights=weights,
            temperature=g.temperature,
            top_k=g.top_k,
            top_p=g.top_p,
            seed=g.seed * 1_000_003 + global_step * 17 + round_,
        )
        drawn.append(ro)
        if g.guidance != "none":
            ro = guide(policy, ro, g.group_size, g.max_new_tokens, weights)
        rounds.append(ro)
        informative.append(grpo.informative_groups(ro.terms, ro.rewards, g.group_size, g.informative))
        if sum(m.sum() for m in informative) >= p:
            break
    return rounds, drawn, informative, replayed


def grpo_step(
    policy, trainer, g: StepSettings, state, ref, boards, step: int, weights, global_step: int, buffer=()
) -> StepOutput:
    """One GRPO update of `trainer` from `policy`'s rollouts of `boards` (see the module
    docstring); `ref`: the reference params (used when grpo.beta > 0); `buffer`: the replay
    buffer (rl/replay.py; used when grpo.replay > 0)."""
    rounds, drawn, informative, replayed = sample_rounds(
        policy, g, state.params, boards, step, weights, global_step, buffer
    )
    ro, signal, trained_replayed = rounds[-1], None, replayed[-1]
    if g.dynamic_sampling:
        picks = grpo.select_groups(informative, g.prompts)
        ro = concat([rounds[r].select(range(i * g.group_size, (i + 1) * g.group_size)) for r, i in picks])
        signal = [informative[r][i] for r, i in picks]
        trained_replayed = np.array([replayed[r][i] for r, i in picks])
    metrics = {
        "guided": float(np.mean(ro.guided)),
        "informative_groups": float(np.mean(np.concatenate(informative))),
        "replayed": float(np.mean(trained_replayed)),  # (the trained batch's groups from the buffer)
    }
    if signal is not None and not any(signal):
        # No group differs: no update at all (with a zero gradient Adam's momentum alone would still
        # move the params; measured: docs/experiments.md, the no-signal rule).
        return StepOutput(state, ro, concat(drawn), metrics | {"no_signal": 1.0})
    adv = grpo.batch_advantages(
        ro.rewards,
        g.group_size,
        g.scale_rewards,
        signal=signal,
        control=g.control,
        seed=g.seed * 1_000_003 + global_step,
    )
    batch = ro.batch() | {"advantages": adv, "sampler_logps": ro.logprobs, "sampled": ~ro.guided}
    if g.old_logprobs == "sampler":
        batch["old_logps"] = ro.logprobs
    batch = trainer.shard(batch)
    timer = getattr(policy, "timer", None) or PhaseTimer()
    with timer.phase("logprobs"):
        if g.old_logprobs == "recompute" and g.num_iterations > 1:
            batch["old_logps"] = jax.block_until_ready(trainer.logprobs(state.params, batch))
        if g.beta:
            batch["ref_logps"] = jax.block_until_ready(trainer.logprobs(ref, batch))
    rows, tokens = len(ro.texts), int(ro.completion_mask.sum() + ro.prompt_mask.sum()) * g.num_iterations
    with timer.phase("update"):
        t0 = time.time()
        for _ in range(g.num_iterations):
            state, update = trainer.update(state, batch)
        metrics = {**{k: float(v) for k, v in update.items()}, **metrics, "no_signal": 0.0}
        metrics["tokens_per_s"] = tokens / max(time.time() - t0, 1e-9)
        model = getattr(trainer, "model_config", None)  # (model FLOPs are counted for Qwen3s)
        per_update = (
            model_flops(model, "train", rows, tokens / g.num_iterations / rows)
            if isinstance(model, Qwen3Config)
            else 0.0
        )
        timer.add("update", tokens=tokens, flops=per_update * g.num_iterations)
    trainer.check_finite(metrics)
    return StepOutput(state, ro, concat(drawn), metrics)
