"""Replay of individual boards scored by learnability: a curriculum inside the stage.

    settings = ReplaySettings.from_config(config)             # grpo.replay* (share 0: off)
    boards, replayed = mix(settings, buffer, fresh, seed)     # a round's boards, `replayed` first
    buffer = update(settings, buffer, boards, valid, group_size, step)

The reference designs are prioritised level replay (PLR, Jiang et al. 2021: replay levels by rank
of their score, mixed with staleness) and sampling for learnability (SFL, Rutherford et al. 2024:
score a level by p(1 - p), p its success rate, and train on a share of the most learnable ones).
A board's score is p(1 - p) with p its group's valid rate under the policy's own samples (the
rows as drawn, before guidance): 0 for boards always or never solved, 1/4 at p = 1/2. The buffer
keeps the `replay_size` boards of highest score seen so far (a board scored again takes its new
score; one scored 0 leaves); each round of a GRPO step takes round(`replay` x prompts) boards from
it (never more than it holds) and the rest from the stage's certified pool, so replay changes
which boards are trained on, never how many. The buffer is a list of JSON entries
`{"board", "score", "seen"}` in the run's record (checkpointed, resumed exactly) and persists
across stages (boards of an earlier stage's distribution stay until they score 0 or are pushed out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from t2t_jax.env import io


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """`grpo.replay` (share of a round's boards replayed, 0..1; 0 turns replay off),
    `grpo.replay_size` (boards the buffer keeps), `grpo.replay_temperature` (PLR's beta: rank
    prioritisation P(i) ~ rank_i^(-1/beta); small is greedy), `grpo.replay_staleness` (PLR's rho:
    the weight of P(i) ~ steps since board i was last trained on)."""

    share: float = 0.0
    size: int = 64
    temperature: float = 0.3
    staleness: float = 0.1

    @classmethod
    def from_config(cls, config) -> ReplaySettings:
        g = config.grpo
        return cls(g.replay, g.replay_size, g.replay_temperature, g.replay_staleness)


def key(board: dict) -> str:
    """A board's identity in the buffer: its text form (map, starts, goals)."""
    return io.board_text(board)


def scores(valid, group_size: int) -> np.ndarray:
    """[G] p(1 - p) of each group's valid rate; `valid`: [G * group_size] 0/1 per sample."""
    p = np.asarray(valid, np.float64).reshape(-1, group_size).mean(axis=1)
    return p * (1.0 - p)


def probabilities(settings: ReplaySettings, buffer: Sequence[dict], step: int) -> np.ndarray:
    """[len(buffer)] PLR's replay distribution: (1 - rho) P_S + rho P_C, P_S by rank of score
    (ties by insertion order), P_C by staleness (steps since last trained on; uniform when all are
    equally fresh)."""
    score = np.array([e["score"] for e in buffer], np.float64)
    rank = np.empty(len(buffer))
    rank[np.argsort(-score, kind="stable")] = np.arange(1, len(buffer) + 1)
    p_score = rank ** (-1.0 / settings.temperature)
    p_score /= p_score.sum()
    stale = np.array([step - e["seen"] for e in buffer], np.float64)
    p_stale = stale / stale.sum() if stale.sum() > 0 else np.full(len(buffer), 1.0 / len(buffer))
    return (1.0 - settings.staleness) * p_score + settings.staleness * p_stale


def mix(settings: ReplaySettings, buffer: Sequence[dict], fresh: Sequence[dict], seed, step: int) -> tuple[list, int]:
    """(a round's `len(fresh)` boards, how many of them were replayed): round(share x
    len(fresh)) boards drawn from `buffer` without replacement (at most all it holds) by
    `probabilities`, then the first of `fresh` for the rest. `seed`: a numpy seed (a sequence of
    ints) for the draw."""
    k = min(int(round(settings.share * len(fresh))), len(buffer))
    if k == 0:
        return list(fresh), 0
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(buffer), size=k, replace=False, p=probabilities(settings, buffer, step))
    return [buffer[i]["board"] for i in picks] + list(fresh[: len(fresh) - k]), k


def update(
    settings: ReplaySettings, buffer: Sequence[dict], boards: Sequence[dict], valid, group_size: int, step: int
) -> list[dict]:
    """The buffer after a step whose groups were `boards` ([G], one per group) with `valid`
    ([G * group_size]) at global step `step`: each board's entry takes its new score and
    `seen` = step; boards scored 0 leave; the `size` highest scores stay (ties: the most
    recently seen, then the earlier entry). Unchanged when replay is off."""
    if settings.share == 0:
        return list(buffer)
    entries = {key(e["board"]): e for e in buffer}
    for board, score in zip(boards, scores(valid, group_size)):
        entries[key(board)] = {"board": board, "score": float(score), "seen": step}
    kept = [e for e in entries.values() if e["score"] > 0]
    kept.sort(key=lambda e: (-e["score"], -e["seen"]))
    return kept[: settings.size]
