"""Evaluation points of a run: what the stage loop measures after the warm start and each stage.

    evaluator = Evaluator(policy, EvalSettings.from_config(config), check=preemption.check)
    entry, scalars = evaluator.point("stage_0", params, boards, results, monitor=monitor_boards)

A point is greedy decoding of the benchmark boards (`benchmark.results_entry`), avg@k on them
with `eval.samples`, avg@k on the training-distribution monitor with `eval.monitor_samples`
(paired with the run's first point: `monitor_vs_first`), and at the last point the paired change
on the benchmark since the first point (`vs_first`) and the out-of-distribution sets of
`eval.ood`; with `eval.target`, avg@k with its standard error on a fixed board set of a target
distribution the curriculum does not train on (`target`, paired: `target_vs_first`). Every
evaluation of a run draws the same random numbers (the run's seed alone, not its grpo_seed), so
two points differ only where the policy does.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from t2t_jax.evaluation import benchmark, decoding, sets
from t2t_jax.jsonrecord import JsonRecord
from t2t_jax.perf import PhaseTimer

# The monitor's boards: one fixed draw from env.initial, the same for every seed and arm.
MONITOR_KEY = 20261202
# The target's boards: one fixed draw from eval.target, the same for every seed and arm.
TARGET_KEY = 20261207


@dataclasses.dataclass(frozen=True, eq=False)
class Point(JsonRecord):
    """One evaluation point of a run (an entry of results.json)."""

    OPTIONAL = (
        "sft_checks",
        "sampled",
        "vs_first",
        "ood",
        "monitor",
        "monitor_vs_first",
        "board_optimal",
        "boards_digest",
        "decoding",
        "target",
        "target_vs_first",
        "grpo",
        "truncated",
    )

    point: str  # "warm_start" / "initial", "stage_0", ...
    boards: int  # benchmark boards, greedy
    valid: float
    optimal: float
    mean_tokens: float
    cells: list  # per (agents, size): boards, valid, optimal, mean_tokens
    board_valid: str  # one "0"/"1" per board, in benchmark order (paired tests)
    sft_checks: list | None = None  # the warm start's checks (warm_start point)
    sampled: dict | None = None  # avg@k on the benchmark boards (eval.samples)
    vs_first: dict | None = None  # the last point: paired change since the first (McNemar)
    ood: dict | None = None  # the last point: the out-of-distribution sets
    monitor: dict | None = None  # avg@k on the monitor boards
    monitor_vs_first: dict | None = None  # paired change of the monitor since the first point
    board_optimal: str | None = None  # one "0"/"1" per board, as board_valid (absent in older runs)
    boards_digest: str | None = None  # benchmark.boards_digest of the boards scored
    decoding: dict | None = None  # how the table was decoded (decoding.record; absent: greedy, older runs)
    target: dict | None = None  # avg@k on the target boards (eval.target), with se_avg_valid
    target_vs_first: dict | None = None  # paired change on the target since the first point
    grpo: dict | None = None  # the stage's GRPO steps in brief (stages.grpo_summary; stage points)
    truncated: float | None = None  # share of the benchmark completions cut by max_new_tokens (absent: older runs)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """The slice of the run's config every evaluation shares."""

    max_new_tokens: int  # rollout.max_new_tokens
    batch_size: int  # eval.batch_size
    reward_weights: dict  # rewards (the first stage's weights)
    temperature: float  # rollout.temperature (sampled evaluations)
    top_p: float  # rollout.top_p
    seed: int
    samples: int = 0  # eval.samples: avg@k on the benchmark boards too (0: greedy only)
    monitor_samples: int = 8  # eval.monitor_samples
    target_samples: int = 8  # eval.target_samples
    ood: tuple[str, ...] = ()  # eval.ood, parsed
    ood_per_cell: int | None = None  # eval.ood_per_cell
    # the table's decoding (eval.decoding, decoding.resolve); a sampling one draws eval.samples too
    decoding: dict = dataclasses.field(default_factory=lambda: decoding.resolve("greedy"))

    @classmethod
    def from_config(cls, c) -> EvalSettings:
        e = c.eval
        return cls(
            max_new_tokens=c.rollout.max_new_tokens,
            batch_size=c.eval.batch_size,
            reward_weights=c.rewards.to_dict(),
            temperature=c.rollout.temperature,
            top_p=c.rollout.top_p,
            seed=c.seed,
            samples=c.eval.samples,
            monitor_samples=c.eval.monitor_samples,
            target_samples=c.eval.get("target_samples", 8),
            ood=sets.parse_ood(c.eval.ood),
            ood_per_cell=c.eval.ood_per_cell,
            decoding=decoding.resolve(e.decoding, e.temperature, e.top_p, e.top_k),
        )


class Evaluator:
    """Evaluations of one run's policy (see the module docstring).

    Args:
      policy: a rollout.Policy.
      settings: EvalSettings.
      check: called before each decode call; may raise to stop (preemption.Preemption.check).
      timer: the run's PhaseTimer (evaluations count as "evaluation").
      progress: progress bars.
    """

    def __init__(
        self,
        policy,
        settings: EvalSettings,
        check: Callable[[], None] | None = None,
        timer: PhaseTimer | None = None,
        progress: bool = False,
    ):
        self.policy, self.settings, self.check, self.progress = policy, settings, check, progress
        self.timer = timer or PhaseTimer()

    def _kw(self) -> dict:
        s = self.settings
        return dict(
            max_new_tokens=s.max_new_tokens,
            batch_size=s.batch_size,
            reward_weights=s.reward_weights,
            progress=self.progress,
            check=self.check,
        )

    def evaluate(self, params, boards: Sequence[dict], desc: str, samples: int = 0, sampling: dict | None = None):
        """Rollouts of `boards`: greedy, or `samples` per board at `sampling` (`decoding.resolve`'s
        temperature / top_p / top_k; None: the rollout's temperature / top_p)."""
        s = self.settings
        sampling = sampling or {"temperature": s.temperature, "top_p": s.top_p, "top_k": 0}
        with self.timer.phase("evaluation"):
            return benchmark.evaluate(
                self.policy,
                params,
                boards,
                desc=desc,
                samples=samples,
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                top_k=sampling["top_k"],
                seed=s.seed,
                **self._kw(),
            )

    def sampled(self, params, boards: Sequence[dict], k: int, desc: str, sampling: dict | None = None) -> dict:
        """avg@k / pass@k of `boards` (`benchmark.sampled_entry`) at `sampling` (as in `evaluate`)."""
        s = self.settings
        sampling = sampling or {"temperature": s.temperature, "top_p": s.top_p, "top_k": 0}
        rollouts = self.evaluate(params, boards, desc, samples=k, sampling=sampling)
        return benchmark.sampled_entry(rollouts, k, sampling["temperature"], sampling["top_p"], sampling["top_k"])

    def decoding_record(self) -> dict:
        """How this evaluator decodes the table (`decoding.record`), for the results files."""
        s = self.settings
        return decoding.record(s.decoding, s.seed, s.max_new_tokens, getattr(self.policy, "enable_thinking", None))

    def point(
        self,
        name: str,
        params,
        boards: Sequence[dict],
        results: Sequence[dict],
        monitor: Sequence[dict] = (),
        paired: bool = False,
        extra: dict | None = None,
        target: Sequence[dict] = (),
    ) -> tuple[Point, dict]:
        """(the results entry of point `name`, its TensorBoard scalars). `results`: the run's
        earlier points (the first is what this one is paired with); `paired` (the last point):
        `vs_first` and the OOD sets; `extra`: more keys of the entry; `monitor`, `target`: their
        boards (empty: not scored)."""
        s = self.settings
        table = benchmark.table_decoding(s.decoding, s.seed)  # (greedy: {})
        with self.timer.phase("evaluation"):
            rollouts = benchmark.evaluate(self.policy, params, boards, desc=f"eval {name}", **table, **self._kw())
        entry = benchmark.results_entry(name, rollouts, decoding=self.decoding_record())
        entry["truncated"] = round(float(np.mean(rollouts.truncated)), 4)  # (the budget, not the policy, decided these)
        entry.update(extra or {})
        if s.samples:  # at the table's sampling settings where it samples, else the rollout's
            sampling = s.decoding if table else None
            entry["sampled"] = self.sampled(params, boards, s.samples, f"eval {name} avg@{s.samples}", sampling)
        first = results[0] if results else None
        if paired and "board_valid" in first:  # (absent in runs begun before it existed)
            entry["vs_first"] = benchmark.paired_change(first, entry)
        values = {
            "benchmark/valid": entry["valid"],
            "benchmark/optimal": entry["optimal"],
            "benchmark/mean_tokens": entry["mean_tokens"],
            "benchmark/truncated": entry["truncated"],
        }
        if paired and s.ood:  # the last point: the out-of-distribution sets too
            entry["ood"] = benchmark.evaluate_ood(self.policy, params, s.ood, s.ood_per_cell, **table, **self._kw())
            values.update({f"ood/{n}/{k}": e[k] for n, e in entry["ood"].items() for k in ("valid", "optimal")})
        for key, sampled_boards, k in (("monitor", monitor, s.monitor_samples), ("target", target, s.target_samples)):
            if not sampled_boards:
                continue
            entry[key] = self.sampled(params, sampled_boards, k, f"{key} {name}")
            if key == "target":
                entry[key]["se_avg_valid"] = standard_error(entry[key]["board_valid_counts"], k)
            values.update({f"{key}/{m}": entry[key][m] for m in ("avg_valid", "avg_optimal", "pass_valid")})
            if first is not None and key in first:
                entry[f"{key}_vs_first"] = {
                    **benchmark.paired_sampled_change(first[key], entry[key]),
                    "against": first["point"],
                }
        return Point.from_json(entry), values


def standard_error(counts: Sequence[int], k: int) -> float:
    """The standard error of avg@k over boards: the SD of the per-board valid rates counts / k
    (counts: [boards] valid samples of k) over the square root of the boards."""
    rates = [c / k for c in counts]
    return round(statistics.stdev(rates) / math.sqrt(len(rates)), 5) if len(rates) > 1 else 0.0
