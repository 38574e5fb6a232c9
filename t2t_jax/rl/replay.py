"""Replay of individual boards scored by learnability: a curriculum inside the stage.

    settings = ReplaySettings.from_config(config)             # grpo.replay* (share 0: off)
    boards, k = mix(settings, buffer, fresh, seed, step, taken)  # a round's boards, k replayed first
    buffer = update(settings, buffer, boards, valid, group_size, step)

The reference designs are prioritised level replay (PLR, Jiang et al. 2021: replay levels by rank
of their score, mixed with staleness) and sampling for learnability (SFL, Rutherford et al. 2024:
score a level by p(1 - p), p its success rate, and train on a share of the most learnable ones).
A board's score is p(1 - p) with p its group's valid rate under the policy's own samples (the
rows as drawn, before guidance): 0 for boards always or never solved, 1/4 at p = 1/2. The buffer
keeps the `replay_size` boards of highest score seen so far (a board scored again takes its new
score; one scored 0 leaves); each round of a GRPO step takes floor(`replay` x prompts) boards
from it (never more than it holds, never one an earlier round of the step took: `replay` < 1
leaves at least one fresh board per round) and the rest from the stage's certified pool, so
replay changes which boards are trained on, never how many. The buffer is a list of JSON entries
`{"board", "score", "seen"}` (`seen`: the global step it was last sampled at) in the run's record
(checkpointed, resumed exactly) and persists across stages: boards of an earlier stage's
distribution stay until they score 0 or are pushed out, with their `bucket` index of that stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import scipy.stats

from t2t_jax.env import io


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """`grpo.replay` (share of a round's boards replayed, [0, 1); 0 turns replay off),
    `grpo.replay_size` (boards the buffer keeps), `grpo.replay_temperature` (PLR's beta: rank
    prioritisation P(i) ~ rank_i^(-1/beta), tied scores sharing their average rank; small is
    greedy), `grpo.replay_staleness` (PLR's rho: the weight of P(i) ~ steps since board i was
    last sampled)."""

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
    """[len(buffer)] PLR's replay distribution: (1 - rho) P_S + rho P_C, P_S ~ rank^(-1/beta) by
    score (rank 1 the highest; tied scores share their average rank, so share P_S evenly), P_C
    by staleness (steps since last sampled, 0 for a board sampled at or after `step`; uniform when
    every board is that fresh). Computed in log space: a tiny beta is greedy, never NaN (entries
    far down the ranks may get probability 0)."""
    score = np.array([e["score"] for e in buffer], np.float64)
    rank = scipy.stats.rankdata(-score, method="average")
    log_w = -np.log(rank) / settings.temperature
    p_score = np.exp(log_w - log_w.max())
    p_score /= p_score.sum()
    stale = np.maximum(np.array([step - e["seen"] for e in buffer], np.float64), 0.0)
    p_stale = stale / stale.sum() if stale.sum() > 0 else np.full(len(buffer), 1.0 / len(buffer))
    return (1.0 - settings.staleness) * p_score + settings.staleness * p_stale


def mix(
    settings: ReplaySettings, buffer: Sequence[dict], fresh: Sequence[dict], seed, step: int, taken=frozenset()
) -> tuple[list, int]:
    """(a round's `len(fresh)` boards, k: how many of them, first, were replayed): k =
    floor(share x len(fresh)) boards drawn from `buffer` without replacement by `probabilities`
    (one at a time, renormalised over those left; once only probability-0 entries are left, the
    best-ranked of them), never one whose key is in `taken` (boards an earlier round of the step
    replayed) and at most as many as are left, then the first of `fresh` for the rest. `seed`: a
    numpy seed (a sequence of ints) for the draw."""
    left = [i for i, e in enumerate(buffer) if key(e["board"]) not in taken]
    k = min(int(settings.share * len(fresh)), len(left))
    if k == 0:
        return list(fresh), 0
    rng = np.random.default_rng(seed)
    p = probabilities(settings, [buffer[i] for i in left], step)
    order = np.argsort(-np.array([buffer[i]["score"] for i in left]), kind="stable")
    picks = []
    for _ in range(k):
        if p.sum() > 0:
            j = int(rng.choice(len(left), p=p / p.sum()))
        else:
            j = int(next(o for o in order if o not in picks))
        picks.append(j)
        p[j] = 0.0
    return [buffer[left[j]]["board"] for j in picks] + list(fresh[: len(fresh) - k]), k


def update(
    settings: ReplaySettings, buffer: Sequence[dict], boards: Sequence[dict], valid, group_size: int, step: int
) -> list[dict]:
    """The buffer after a step whose groups were `boards` ([G], one per group) with `valid`
    ([G * group_size]) at global step `step`: each board's entry takes its new score (a board
    sampled in several groups: p over all its samples) and `seen` = step; boards scored 0 leave;
    the `size` highest scores stay (ties: the most recently seen, then the earlier entry).
    Unchanged when replay is off."""
    if settings.share == 0:
        return list(buffer)
    entries = {key(e["board"]): e for e in buffer}
    samples: dict[str, list] = {}
    per_group = np.asarray(valid, np.float64).reshape(-1, group_size)
    for board, rows in zip(boards, per_group):
        samples.setdefault(key(board), [board, []])[1].extend(rows)
    for k, (board, rows) in samples.items():
        entries[k] = {"board": board, "score": float(scores(rows, len(rows))[0]), "seen": step}
    kept = [e for e in entries.values() if e["score"] > 0]
    kept.sort(key=lambda e: (-e["score"], -e["seen"]))
    return kept[: settings.size]
