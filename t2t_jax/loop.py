"""What every phase of the stage loop is given: `Loop`, the run's collaborators.

    loop.guard(run, fn)           # one unit of work (preemption.Preemption.guard)
    loop.save(run)                # a checkpoint of a RunState and the records beside it
    loop.boards(env, key, num)    # certified boards of an EnvConfig (stoppable between chunks)
    loop.draw(env, key, num)      # the same and, per bucket, the boards the generator replaced
    loop.key(7)                   # the warm start's keys: functions of (seed, parts) only
    loop.grpo_key(100, s)         # the GRPO phase's and the curriculum's: of (grpo_seed, parts)
    loop.writer                   # TensorBoard (made at its first write)

A phase is a function `phase(loop, run, ...) -> run` of an explicit `runrecord.RunState`
(t2t_jax/rl/warm_start.py, t2t_jax/rl/stage.py, the stage's end in t2t_jax/stages.py); it
changes nothing it is given but returns the new state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from t2t_jax import distributed, fields
from t2t_jax.env import io
from t2t_jax.env.certified import CertifiedGenerator, merge_replaced
from t2t_jax.env.config import EnvConfig
from t2t_jax.evaluation.points import Evaluator
from t2t_jax.perf import PhaseTimer
from t2t_jax.preemption import Preemption
from t2t_jax.rollout import Policy
from t2t_jax.runrecord import RunState


@dataclasses.dataclass
class Loop:
    config: Any  # the run's ConfigDict (each phase reads its own sections)
    policy: Policy  # decodes for rollouts, evaluations and the engineer
    evaluator: Evaluator
    preemption: Preemption
    timer: PhaseTimer  # where a stage's time goes
    save: Callable[[RunState], None]  # checkpoint + records (results.json, proposals.jsonl)
    make_writer: Callable[[], Any]  # -> logging.SummaryWriter
    progress: bool = True
    _writer: Any = None

    @property
    def writer(self):
        """TensorBoard events, the file made at the first write (reading a run adds none)."""
        if self._writer is None:
            self._writer = self.make_writer()
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def guard(self, run: RunState, fn: Callable[[], Any]):
        """`fn()` as one unit of work begun at `run` (preemption.Preemption.guard)."""
        return self.preemption.guard(run, fn)

    def key(self, *parts: int):
        """The warm start's key folded with `parts` (a function of (seed, parts) only)."""
        return _fold(self.config.seed, parts)

    def grpo_key(self, *parts: int):
        """The GRPO phase's key folded with `parts` (a function of (grpo_seed, parts) only; the
        same as `key` while grpo_seed is the run's seed, its default)."""
        return _fold(fields.grpo_seed(self.config), parts)

    def boards(self, env: EnvConfig, key, num: int) -> list[dict]:
        """`num` certified boards of `env` (with their optimal plans), as JSON-ready dicts (`draw`)."""
        return self.draw(env, key, num)[0]

    def draw(self, env: EnvConfig, key, num: int) -> tuple[list[dict], dict]:
        """-> (`num` certified boards of `env` with their optimal plans as JSON-ready dicts, per
        bucket the boards generated and replaced in the chunks used: `CertifyStats.replaced`);
        the same on one host or several. On several hosts the chunks are dealt round-robin (host h
        certifies chunk r * hosts + h of round r, its solver work included) and every host joins
        each round's boards in chunk order, up to the chunk that completes `num` as one host
        would: adding hosts divides the certification, and boards and counts are every host's
        and the single host's alike. A stop is checked before each chunk (on several hosts
        before each round, agreed by all)."""
        gen = CertifiedGenerator(env, horizon=self.config.env.horizon, chunk=self.config.env.chunk)
        hosts, host = jax.process_count(), jax.process_index()
        with self.timer.phase("certification"):
            if hosts == 1:
                boards = io.boards_with_plans_to_json(*gen(key, num, check=self.preemption.check))
                return boards, gen.last_stats.replaced
            out, replaced, r = [], {}, 0
            while len(out) < num:
                self.preemption.check()
                mine = io.boards_with_plans_to_json(*gen.chunk_boards(key, r * hosts + host))
                for part in distributed.from_every_host({"boards": mine, "replaced": gen.last_stats.replaced}):
                    if len(out) < num:
                        out += part["boards"]
                        replaced = merge_replaced(replaced, part["replaced"])
                r += 1
            return out[:num], replaced


def _fold(seed: int, parts) -> jax.Array:
    key = jax.random.key(seed)
    for p in parts:
        key = jax.random.fold_in(key, p)
    return key
