"""`RunRecord`: the JSON record a stage-loop checkpoint carries beside the train state.

    record = RunRecord.start(first_config_json, reward_weights, sft=True)
    ckpt.save(step, state, record.to_json())
    record = RunRecord.from_json(ckpt.meta(step), config)   # old checkpoints upgraded first

It holds the cursor (phase, stage, step), the counter of checkpoints written, and everything a
resumed run needs to continue exactly: the configs and reward weights so far, the engineer's
records, the evaluation points (results.json), the failure accounts, the GRPO trajectory and
the replay buffer.
`RunState` is what the stage loop's phases map to their successors: the train state, the
reference params and this record. A record is never changed in place: a phase returns a new one
(`dataclasses.replace`), so the state a unit of work began from stays intact for a checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t2t_jax.engineer.context import Account
from t2t_jax.engineer.engineer import Proposal
from t2t_jax.evaluation.points import Point

PHASES = ("sft", "warm", "grpo")


@dataclasses.dataclass
class RunRecord:
    phase: str  # one of PHASES: the SFT warm start, its evaluation, the GRPO stages
    stage: int  # the GRPO stage under way (== config.stages when done)
    step: int  # the next step of the phase (SFT or GRPO)
    counter: int  # checkpoints written (the next one is counter + 1)
    history: list  # the EnvConfig JSON of each stage, the first from env.initial
    weights: list  # the reward weights of each stage
    records: list[Proposal]  # the engineer's records (proposals.jsonl)
    results: list[Point]  # the evaluation points (results.json)
    accounts: list[Account]  # the failure account of each finished stage
    trajectory: list  # one point per GRPO step (rl/step.py trajectory_point)
    has_ref: bool = False  # whether the checkpoint holds reference params
    sft_round: int = 0  # the SFT round under way: 0 the main one, r > 0 the r-th extra (sft.extra_steps)
    sft_checks: list = dataclasses.field(default_factory=list)  # the warm-start check after each round
    replay: list = dataclasses.field(default_factory=list)  # the replay buffer of learnable boards (rl/replay.py)

    @classmethod
    def start(cls, first: dict, weights: dict, sft: bool) -> RunRecord:
        """The record of a fresh run."""
        return cls("sft" if sft else "warm", 0, 0, 0, [first], [weights], [], [], [], [])

    @classmethod
    def from_json(cls, data: dict, config) -> RunRecord:
        """A checkpoint's record (keys older code did not write filled: `upgrade_meta`)."""
        data = upgrade_meta(data, config)
        names = {f.name for f in dataclasses.fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in names})
        record.records = [Proposal.from_json(r) for r in record.records]
        record.accounts = [Account.from_json(a) for a in record.accounts]
        record.results = [Point.from_json(p) for p in record.results]
        return record

    def to_json(self) -> dict:
        """The JSON object (the typed records as theirs)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        typed = ("records", "accounts", "results")
        return out | {name: [x.to_json() for x in getattr(self, name)] for name in typed}


def upgrade_meta(meta: dict, config) -> dict:
    """A checkpoint's JSON record with the keys older code did not write: `has_ref` (whether a
    reference model was saved: then grpo.beta > 0 and past the SFT phase) and `trajectory` (the
    GRPO steps' points for the engineer's account: none recorded)."""
    out = dict(meta)
    out.setdefault("has_ref", bool(config.grpo.beta) and out["phase"] != "sft")
    out.setdefault("trajectory", [])
    return out


@dataclasses.dataclass(frozen=True)
class RunState:
    """The explicit state of the stage loop between two units of work."""

    train: Any  # rl.trainer.TrainState: params, optimizer state, step
    ref: Any  # the GRPO phase's starting params when kept (RunRecord.has_ref), else {}
    record: RunRecord

    def replace(self, **changes) -> RunState:
        """A copy with `changes`; keys of RunRecord go to a copy of the record."""
        names = {f.name for f in dataclasses.fields(RunRecord)}
        record = {k: changes.pop(k) for k in list(changes) if k in names}
        if record:
            changes["record"] = dataclasses.replace(self.record, **record)
        return dataclasses.replace(self, **changes)
