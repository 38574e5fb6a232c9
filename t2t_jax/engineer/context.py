"""The failure account: what the engineer reads about a stage, as JSON and as prompt text.

Sections (`SECTIONS`; `engineer.sections` picks which the prompt shows, each one flag of the
context ablations):
- `statistics`: overall and per bucket of the stage's config: boards tried, valid and optimal
  rates with 95% Wilson intervals, each verdict flag and parse status, mean completion length
  and reward, the change in valid rate from the previous stage for the same bucket;
- `breakdown`: within each bucket, cells of (map size, agent count, hole-density band) with
  their rates, intervals and failure flags, the worst first (`breakdown`);
- `training`: the stage's GRPO trajectory in brief: reward, valid rate, completion length,
  entropy, KL, clip fractions over the updates (`training_details`);
- `cases`: raw failure cases (board text, the model's answer, the verdict) up to a budget;
- `history`: earlier configs and the valid rate that followed each.
The generator's legal ranges are always shown.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np

from t2t_jax.env import io
from t2t_jax.env.config import MAX_HOLE_DENSITY, MIN_SIZE, EnvConfig
from t2t_jax.env.types import ParseStatus
from t2t_jax.fields import parse_names
from t2t_jax.jsonrecord import JsonRecord

FLAGS = (
    "out_of_bounds",
    "hole",
    "vertex_collision",
    "edge_collision",
    "missing_agent",
    "unknown_agent",
    "parse_error",
    "truncated",
)


SECTIONS = ("statistics", "breakdown", "training", "cases", "history")
HOLE_BANDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # hole-density bands of the breakdown: [lo, hi)
TRAJECTORY = ("reward", "valid", "tokens", "entropy", "kl", "clip_low", "clip_high")


def parse_sections(spec: str) -> tuple[str, ...]:
    """ "statistics,cases" -> the named sections; ValueError names an unknown one."""
    return parse_names(spec, SECTIONS, "engineer.sections")


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a rate, [low, high] (for n = 0: [0, 1])."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def bucket_stats(rollouts, rows: np.ndarray) -> dict:
    """Statistics of the rollout rows `rows` (indices into a Rollouts)."""
    v = rollouts.verdicts
    n = len(rows)
    valid, optimal = int(v.valid[rows].sum()), int(v.optimal[rows].sum())
    statuses = np.asarray(rollouts.plans.parse_status)[rows]
    return {
        "boards": n,
        "valid": round(valid / max(n, 1), 4),
        "valid_ci": wilson(valid, n),
        "optimal": round(optimal / max(n, 1), 4),
        "optimal_ci": wilson(optimal, n),
        "failures": {f: int(np.asarray(getattr(v, f))[rows].sum()) for f in FLAGS}
        | {"goals_not_reached": int((~np.asarray(v.all_goals_reached)[rows]).sum())},
        "parse_status": {s.name.lower(): int((statuses == s).sum()) for s in ParseStatus},
        "mean_tokens": round(float(np.mean(rollouts.lengths[rows])) if n else 0.0, 2),
        "mean_reward": round(float(np.mean(rollouts.rewards[rows])) if n else 0.0, 4),
    }


def failure_cases(rollouts, budget: int, answer_chars: int = 400) -> list[dict]:
    """Up to `budget` invalid rows, spread over buckets (round robin), as raw evidence."""
    bad = np.flatnonzero(~np.asarray(rollouts.verdicts.valid))
    by_bucket: dict[int, list[int]] = {}
    for i in bad:
        by_bucket.setdefault(int(rollouts.boards[i].get("bucket", 0)), []).append(int(i))
    picked, queues = [], [list(q) for _, q in sorted(by_bucket.items())]
    while len(picked) < budget and any(queues):
        for q in queues:
            if q and len(picked) < budget:
                picked.append(q.pop(0))
    cases = []
    for i in picked:
        verdict = io.verdict_to_json(rollouts.verdicts, i)
        flags = [f for f in FLAGS if verdict[f]] or (["goals_not_reached"] if not verdict["all_goals_reached"] else [])
        cases.append(
            {
                "bucket": int(rollouts.boards[i].get("bucket", 0)),
                "board": io.board_text(rollouts.boards[i]),
                "answer": rollouts.texts[i][:answer_chars],
                "verdict": flags,
                "parse_status": ParseStatus(int(rollouts.plans.parse_status[i])).name.lower(),
            }
        )
    return cases


def hole_band(board: dict) -> int:
    """The hole-density band index of a board (the last band is closed: 0.5 goes in [0.4, 0.5])."""
    density = len(board["holes"]) / board["size"] ** 2
    return min(int(np.searchsorted(HOLE_BANDS, density, side="right")) - 1, len(HOLE_BANDS) - 2)


def breakdown(rollouts, buckets: np.ndarray, limit: int) -> list[dict]:
    """The `limit` worst cells of (bucket, map size, agents, hole band) over the rollout rows
    (`buckets` [rows]: each row's bucket), ranked by valid rate, then by the most boards; each
    with its rates, 95% intervals and the failure flags seen."""
    keys = [
        (int(b), int(board["size"]), len(board["starts"]), hole_band(board))
        for b, board in zip(buckets, rollouts.boards)
    ]
    cells = {}
    for i, key in enumerate(keys):
        cells.setdefault(key, []).append(i)
    out = []
    for (bucket, size, agents, band), rows in cells.items():
        stats = bucket_stats(rollouts, np.asarray(rows))
        out.append(
            {
                "bucket": bucket,
                "size": size,
                "agents": agents,
                "holes": [HOLE_BANDS[band], HOLE_BANDS[band + 1]],
                "boards": stats["boards"],
                "valid": stats["valid"],
                "valid_ci": stats["valid_ci"],
                "optimal": stats["optimal"],
                "failures": {k: v for k, v in stats["failures"].items() if v},
            }
        )
    out.sort(key=lambda c: (c["valid"], -c["boards"], c["bucket"], c["size"], c["agents"], c["holes"]))
    return out[:limit]


def training_details(trajectory: Sequence[dict]) -> dict:
    """The stage's updates in brief: for each TRAJECTORY key, the mean over the first and the
    last quarter of the updates (at least one each) and over all; `updates` (those that ran) and
    `no_signal` (steps without an update)."""
    if not trajectory:
        return {}
    q = max(1, len(trajectory) // 4)
    skipped = sum(1 for t in trajectory if t.get("no_signal"))
    out = {"updates": len(trajectory) - skipped, "no_signal": skipped}
    for key in TRAJECTORY:
        values = [t[key] for t in trajectory if t.get(key) is not None]
        if values:
            first, last = values[:q], values[-q:]
            out[key] = {
                "first": round(float(np.mean(first)), 4),
                "last": round(float(np.mean(last)), 4),
                "mean": round(float(np.mean(values)), 4),
            }
    return out


def legal_ranges(config: EnvConfig) -> dict:
    return {
        "size": [MIN_SIZE, config.max_size],
        "agents": [1, config.max_agents],
        "hole_density": [0.0, MAX_HOLE_DENSITY],
        "min_distance": [0, 2 * (config.max_size - 1)],
        "rule": "min_distance + agents - 1 <= 2*(size-1) and min_distance + agents <= free cells",
    }


@dataclasses.dataclass(frozen=True, eq=False)
class Account(JsonRecord):
    """The failure account of one stage's held-out evaluation (what the engineer reads)."""

    stage: int
    config: dict  # the stage's EnvConfig JSON
    reward_weights: dict
    overall: dict  # bucket_stats of every held-out board: boards, valid, valid_ci, optimal, failures, ...
    buckets: list  # per bucket of the config: {"bucket", "config", **bucket_stats, "change_in_valid"}
    breakdown: list  # the worst (bucket, size, agents, hole band) cells (`breakdown`)
    training: dict  # the stage's updates in brief (`training_details`)
    failure_cases: list  # raw cases (`failure_cases`)
    history: list  # earlier stages: {"stage", "config", "valid"}
    legal_ranges: dict

    def history_entry(self) -> dict:
        """This stage as a later account's `history` item."""
        return {"stage": self.stage, "config": self.config, "valid": self.overall["valid"]}


def build_account(
    stage: int,
    config: EnvConfig,
    reward_weights: dict,
    rollouts,
    *,
    cases: int,
    previous: dict | None = None,
    history: Sequence[dict] = (),
    breakdown_cells: int = 8,
    trajectory: Sequence[dict] = (),
) -> Account:
    """The account of one stage's held-out evaluation (rollouts' boards carry "bucket");
    `trajectory`: one dict of TRAJECTORY values per GRPO step of the stage."""
    buckets = np.array([int(b.get("bucket", 0)) for b in rollouts.boards])
    per_bucket = []
    prev = {json.dumps(b["config"], sort_keys=True): b for b in (previous or {}).get("buckets", [])}
    for i, bucket in enumerate(config.buckets):
        stats = bucket_stats(rollouts, np.flatnonzero(buckets == i))
        before = prev.get(json.dumps(bucket.to_json(), sort_keys=True))
        stats["change_in_valid"] = None if before is None else round(stats["valid"] - before["valid"], 4)
        per_bucket.append({"bucket": i, "config": bucket.to_json(), **stats})
    overall = bucket_stats(rollouts, np.arange(len(rollouts.boards)))
    return Account(
        stage=stage,
        config=config.to_json(),
        reward_weights=dict(reward_weights),
        overall=overall,
        buckets=per_bucket,
        breakdown=breakdown(rollouts, buckets, breakdown_cells) if breakdown_cells else [],
        training=training_details(trajectory),
        failure_cases=failure_cases(rollouts, cases) if cases else [],
        history=list(history),
        legal_ranges=legal_ranges(config),
    )


def account_text(account: dict, evidence: str | None = None, sections: Sequence[str] = SECTIONS) -> str:
    """The account as prompt text, the `sections` named (SECTIONS order). `evidence` replaces the
    raw failure cases (the model's own summary, for the summarised-evidence ablation)."""
    lines = [f"Stage {account['stage']} results. Reward weights: {json.dumps(account['reward_weights'])}"]
    if "statistics" in sections:
        o = account["overall"]
        lines.append(f"Overall: valid {o['valid']:.2f}, optimal {o['optimal']:.2f}, mean tokens {o['mean_tokens']:.0f}")
        for b in account["buckets"]:
            fails = {k: v for k, v in b["failures"].items() if v}
            change = "" if b["change_in_valid"] is None else f", change {b['change_in_valid']:+.2f}"
            lines.append(
                f"Bucket {b['bucket']} {json.dumps(b['config'])}: {b['boards']} boards, valid "
                f"{b['valid']:.2f} {b['valid_ci']}, optimal {b['optimal']:.2f}{change}, failures "
                f"{json.dumps(fails)}, mean tokens {b['mean_tokens']:.0f}"
            )
    if "breakdown" in sections and account.get("breakdown"):
        lines.append("Worst cells (bucket, size, agents, hole density):")
        for c in account["breakdown"]:
            lines.append(
                f"  bucket {c['bucket']}, {c['size']}x{c['size']}, {c['agents']} agents, holes "
                f"{c['holes'][0]:.1f}-{c['holes'][1]:.1f}: {c['boards']} boards, valid {c['valid']:.2f} "
                f"{c['valid_ci']}, optimal {c['optimal']:.2f}, failures {json.dumps(c['failures'])}"
            )
    if "training" in sections and account.get("training"):
        t = account["training"]
        trend = ", ".join(f"{k} {t[k]['first']:.3g} -> {t[k]['last']:.3g}" for k in TRAJECTORY if k in t)
        lines.append(f"Training: {t['updates']} updates ({t['no_signal']} steps without signal); {trend}")
    if "cases" in sections:
        if evidence is not None:
            lines.append(f"Summary of failures: {evidence}")
        for c in account["failure_cases"]:
            lines.append(
                f"Failure (bucket {c['bucket']}, {', '.join(c['verdict']) or c['parse_status']}):\n"
                f"{c['board']}\nAnswer: {c['answer']}"
            )
    if "history" in sections:
        for h in account["history"]:
            lines.append(f"Earlier: stage {h['stage']} config {json.dumps(h['config'])} -> valid {h['valid']:.2f}")
    lines.append(f"Legal ranges: {json.dumps(account['legal_ranges'])}")
    return "\n".join(lines)
