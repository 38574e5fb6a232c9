"""The failure account: what the engineer reads about a stage, as JSON and as prompt text.

Per bucket of the stage's config: boards tried, valid and optimal rates with 95% Wilson
intervals, the failure breakdown (each verdict flag and parse status), mean completion length
and reward, the change in valid rate from the previous stage for the same bucket; then raw
failure cases (board text, the model's answer, the verdict) up to a budget; the history of
earlier configs and the valid rate that followed each; and the generator's legal ranges.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from t2t_jax.env import io
from t2t_jax.env.config import MAX_HOLE_DENSITY, MIN_SIZE, EnvConfig
from t2t_jax.env.types import ParseStatus

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


def legal_ranges(config: EnvConfig) -> dict:
    return {
        "size": [MIN_SIZE, config.max_size],
        "agents": [1, config.max_agents],
        "hole_density": [0.0, MAX_HOLE_DENSITY],
        "min_distance": [0, 2 * (config.max_size - 1)],
        "rule": "min_distance + agents - 1 <= 2*(size-1) and min_distance + agents <= free cells",
    }


def build_account(
    stage: int,
    config: EnvConfig,
    reward_weights: dict,
    rollouts,
    *,
    cases: int,
    previous: dict | None = None,
    history: Sequence[dict] = (),
) -> dict:
    """The account of one stage's held-out evaluation (rollouts' boards carry "bucket")."""
    buckets = np.array([int(b.get("bucket", 0)) for b in rollouts.boards])
    per_bucket = []
    prev = {json.dumps(b["config"], sort_keys=True): b for b in (previous or {}).get("buckets", [])}
    for i, bucket in enumerate(config.buckets):
        stats = bucket_stats(rollouts, np.flatnonzero(buckets == i))
        before = prev.get(json.dumps(bucket.to_json(), sort_keys=True))
        stats["change_in_valid"] = None if before is None else round(stats["valid"] - before["valid"], 4)
        per_bucket.append({"bucket": i, "config": bucket.to_json(), **stats})
    overall = bucket_stats(rollouts, np.arange(len(rollouts.boards)))
    return {
        "stage": stage,
        "config": config.to_json(),
        "reward_weights": dict(reward_weights),
        "overall": overall,
        "buckets": per_bucket,
        "failure_cases": failure_cases(rollouts, cases) if cases else [],
        "history": list(history),
        "legal_ranges": legal_ranges(config),
    }


def account_text(account: dict, evidence: str | None = None) -> str:
    """The account as prompt text. `evidence` replaces the raw failure cases (the model's own
    summary, for the summarised-evidence ablation)."""
    lines = [
        f"Stage {account['stage']} results. Reward weights: {json.dumps(account['reward_weights'])}",
        f"Overall: valid {account['overall']['valid']:.2f}, optimal {account['overall']['optimal']:.2f}, "
        f"mean tokens {account['overall']['mean_tokens']:.0f}",
    ]
    for b in account["buckets"]:
        fails = {k: v for k, v in b["failures"].items() if v}
        change = "" if b["change_in_valid"] is None else f", change {b['change_in_valid']:+.2f}"
        lines.append(
            f"Bucket {b['bucket']} {json.dumps(b['config'])}: {b['boards']} boards, valid "
            f"{b['valid']:.2f} {b['valid_ci']}, optimal {b['optimal']:.2f}{change}, failures "
            f"{json.dumps(fails)}, mean tokens {b['mean_tokens']:.0f}"
        )
    if evidence is not None:
        lines.append(f"Summary of failures: {evidence}")
    for c in account["failure_cases"]:
        lines.append(
            f"Failure (bucket {c['bucket']}, {', '.join(c['verdict']) or c['parse_status']}):\n"
            f"{c['board']}\nAnswer: {c['answer']}"
        )
    for h in account["history"]:
        lines.append(f"Earlier: stage {h['stage']} config {json.dumps(h['config'])} -> valid {h['valid']:.2f}")
    lines.append(f"Legal ranges: {json.dumps(account['legal_ranges'])}")
    return "\n".join(lines)
