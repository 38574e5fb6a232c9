"""GRPO: group advantages and the clipped policy loss, with loss aggregations by name.

Definitions follow TRL's `GRPOTrainer` so results compare with the most used implementation:

    ratio   = exp(clip(logp - old_logp, -20, 20))      (the clamp as in tunix: no inf ratios)
    token   = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * KL
    KL (k3) = exp(ref - logp) - (ref - logp) - 1

and the per-token losses are summed with per-token weights chosen by `loss_type` (`LOSSES`):

    grpo     mean over sequences of each sequence's token mean
    bnpo     sum over the active tokens of the (micro-)batch / their number
    dr_grpo  sum / (sequences x max completion length)
    dapo     sum / active tokens of the global batch (across micro-batches and hosts)

Every aggregation is a weighted sum, so a micro-batch's share of the full-batch loss is exact
when the weights are computed from the full batch's `Totals` (trainer.py does this); `bnpo`
alone is defined per micro-batch, as in TRL. Shapes: B completions, T completion tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

SCALES = ("group", "batch", "none")
LOG_RATIO_CLAMP = 20.0
# grpo.control: "shuffle" permutes the advantages within each group (same magnitudes, no signal).
CONTROLS = ("none", "shuffle")
# grpo.informative: which rewards must differ inside a group for dynamic sampling to keep it.
INFORMATIVE = ("accuracy", "reward")


def group_advantages(rewards, group_size: int, scale: str = "group"):
    """rewards [B] (B = prompts x group_size, groups contiguous) -> advantages [B].

    `(r - mean_g) / (std + 1e-4)` with the Bessel-corrected std of the group (`group`), of the
    whole batch (`batch`), or no division (`none`)."""
    if scale not in SCALES:
        raise ValueError(f"scale_rewards: {scale!r} is not one of {SCALES}")
    r = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
    centred = r - r.mean(axis=1, keepdims=True)
    if scale == "group":
        centred = centred / (jnp.std(r, axis=1, ddof=1, keepdims=True) + 1e-4)
    elif scale == "batch":
        centred = centred / (jnp.std(r, ddof=1) + 1e-4)
    return centred.reshape(-1)


def shuffle_within_groups(advantages, group_size: int, seed: int) -> np.ndarray:
    """advantages [B] -> [B], each group's values permuted (a seeded, per-group permutation):
    the shuffle control, an update of GRPO's size and shape that carries no reward signal."""
    a = np.asarray(advantages).reshape(-1, group_size)
    rng = np.random.default_rng(seed)
    return np.take_along_axis(a, rng.permuted(np.tile(np.arange(group_size), (len(a), 1)), axis=1), axis=1).reshape(-1)


def informative_groups(terms: dict, rewards, group_size: int, key: str = "accuracy") -> np.ndarray:
    """[G] bool: the groups whose samples differ in the accuracy terms (`valid`, `optimal`) or,
    with key "reward", in the total reward (then a shaping term alone, e.g. length, counts)."""
    if key not in INFORMATIVE:
        raise ValueError(f"grpo.informative: {key!r} is not one of {INFORMATIVE}")
    if key == "reward":
        score = np.asarray(rewards, np.float64)
    else:
        score = 2.0 * np.asarray(terms["valid"], np.float64) + np.asarray(terms["optimal"], np.float64)
    score = score.reshape(-1, group_size)
    return (score != score[:, :1]).any(axis=1)


def select_groups(informative: list, prompts: int) -> list[tuple[int, int]]:
    """Dynamic sampling's batch: (round, group) pairs, `prompts` of them, never one twice.

    `informative[r]` is round r's [G] bool mask (G >= prompts groups drawn per round). The
    informative groups come first, in round order; when fewer than `prompts` were found, the
    batch is filled with the last round's groups not taken yet (there are always enough: the
    last round gave at most as many informative groups as were kept in all)."""
    picked = [(r, int(g)) for r, mask in enumerate(informative) for g in np.flatnonzero(mask)][:prompts]
    last = len(informative) - 1
    taken = {g for r, g in picked if r == last}
    fill = [(last, g) for g in range(len(informative[last])) if g not in taken]
    return picked + fill[: prompts - len(picked)]


def batch_advantages(
    rewards, group_size: int, scale: str = "group", *, signal=None, control: str = "none", seed: int = 0
) -> np.ndarray:
    """The update's advantages [B] from rewards [B] (groups contiguous): `group_advantages`,
    0 for the groups whose `signal` [G] is False (dynamic sampling's fill: padding that keeps the
    batch's shape), then under `control` "shuffle" permuted within each group."""
    if control not in CONTROLS:
        raise ValueError(f"grpo.control: {control!r} is not one of {CONTROLS}")
    adv = np.asarray(group_advantages(rewards, group_size, scale))
    if signal is not None:
        adv = adv * np.repeat(np.asarray(signal, bool), group_size)
    return shuffle_within_groups(adv, group_size, seed) if control == "shuffle" else adv


@chex.dataclass(frozen=True)
class Totals:
    """Counts of the full batch that the weights divide by (scalars): `sequences`, active
    `tokens`, `max_length` (T), `chunks` (micro-batches the batch is cut into)."""

    sequences: chex.Array
    tokens: chex.Array
    max_length: chex.Array
    chunks: chex.Array


def totals_of(mask, chunks: int = 1) -> Totals:
    """Totals of a [B, T] completion mask (global when the mask is a global array)."""
    mask = jnp.asarray(mask, jnp.float32)
    return Totals(
        sequences=jnp.float32(mask.shape[0]),
        tokens=jnp.maximum(mask.sum(), 1.0),
        max_length=jnp.float32(mask.shape[1]),
        chunks=jnp.float32(chunks),
    )


def _grpo(mask, totals):
    return mask / jnp.maximum(mask.sum(axis=1, keepdims=True), 1.0) / totals.sequences


def _bnpo(mask, totals):
    return mask / jnp.maximum(mask.sum(), 1.0) / totals.chunks


def _dr_grpo(mask, totals):
    return mask / (totals.sequences * totals.max_length)


def _dapo(mask, totals):
    return mask / totals.tokens


# loss_type -> (mask [B, T] float, Totals) -> per-token weights [B, T].
LOSSES: dict[str, Callable] = {"grpo": _grpo, "bnpo": _bnpo, "dr_grpo": _dr_grpo, "dapo": _dapo}


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The policy loss (`grpo.*`): `loss_type` (a name in LOSSES), PPO-style clipping of the
    ratio to [1 - epsilon_low, 1 + epsilon_high], and the KL penalty's weight `beta`."""

    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0

    def __post_init__(self):
        if self.loss_type not in LOSSES:
            raise ValueError(f"grpo.loss_type: {self.loss_type!r} is not one of {sorted(LOSSES)}")

    @classmethod
    def from_config(cls, grpo) -> LossSettings:
        """From the config's `grpo` section."""
        return cls(**{f.name: grpo[f.name] for f in dataclasses.fields(cls)})


def policy_loss(
    logps, old_logps, ref_logps, advantages, mask, config: LossSettings, *, totals: Totals | None = None, entropies=None
):
    """The GRPO loss of one (micro-)batch and its metrics.

    Args:
      logps, old_logps: [B, T] log-probs of the completion tokens under the current and the
        sampling policy; ref_logps: [B, T] under the reference (ignored, may be None, when
        config.beta == 0); advantages: [B]; mask: [B, T] (1 on completion tokens).
      config: the LossSettings.
      totals: counts of the full batch (default: this batch's own, `totals_of(mask)`).
      entropies: optional [B, T] exact per-token entropies; without them `entropy` is the
        Monte-Carlo estimate -mean(logp) over active tokens.

    Returns (loss, metrics): metrics are token means over active tokens: `clip_low`,
    `clip_high` (fractions clipped below / above, as TRL counts them), `kl`, `entropy`, `ratio`.
    """
    mask = jnp.asarray(mask, jnp.float32)
    totals = totals if totals is not None else totals_of(mask)
    adv = jnp.asarray(advantages, jnp.float32)[:, None]
    ratio = jnp.exp(jnp.clip(logps - old_logps, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    clipped = jnp.clip(ratio, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high)
    per_token = -jnp.minimum(ratio * adv, clipped * adv)
    if config.beta != 0.0:
        delta = ref_logps - logps
        kl = jnp.exp(delta) - delta - 1.0
        per_token = per_token + config.beta * kl
    else:
        kl = jnp.zeros_like(logps)
    loss = jnp.sum(per_token * LOSSES[config.loss_type](mask, totals))
    n = jnp.maximum(mask.sum(), 1.0)

    def mean(x):
        return jnp.sum(jax.lax.stop_gradient(x) * mask) / n

    ent = -logps if entropies is None else entropies
    metrics = {
        "clip_low": mean((ratio < 1.0 - config.epsilon_low) & (adv < 0)),
        "clip_high": mean((ratio > 1.0 + config.epsilon_high) & (adv > 0)),
        "kl": mean(kl),
        "entropy": mean(ent),
        "ratio": mean(ratio),
    }
    return loss, metrics
