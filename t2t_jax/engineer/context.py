"""The failure account: what the engineer reads about a stage, as JSON and as prompt text.

Sections (`SECTIONS`; `engineer.sections` picks which the prompt shows, each one flag of the
context ablations):
- `statistics`: overall and per bucket of the stage's config: boards tried, valid and optimal
  rates with 95% Wilson intervals, each verdict flag and parse status, the share of completions
  cut by the token budget (`truncated`), mean completion length and reward, the change in valid
  rate from the previous stage for the same bucket; and the environment statistics per bucket
  of the boards trained and evaluated (`environment`: size, agents, hole density, optimal
  makespan, distance to goal, the share of generated boards the certified generator replaced);
- `breakdown`: within each bucket, cells of (map size, agent count, hole-density band) with
  their rates, intervals and failure flags, the worst first (`breakdown`);
- `training`: the stage's GRPO trajectory in brief: reward, valid rate, completion length,
  entropy, KL, clip fractions over the updates (`training_details`);
- `cases`: raw failure cases up to a budget: the board, the final answer (after `</think>`, as
  the parser reads it), the plan read from it, the verdict flags and the first violation (which
  agent, which step, what happened), within `CASE_CHARS` characters of answer and plan;
- `history`: earlier configs and the valid rate that followed each.
The generator's legal ranges are always shown.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np

from t2t_jax.env import io, reference
from t2t_jax.env.config import MAX_HOLE_DENSITY, MIN_SIZE, EnvConfig
from t2t_jax.env.types import ACTION_NAMES, ParseStatus
from t2t_jax.fields import parse_names
from t2t_jax.jsonrecord import JsonRecord
from t2t_jax.text.parsing import answer_text

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
CASE_CHARS = 600  # a failure case's answer and plan text, at most (half each)
BOARD_STATS = ("size", "agents", "hole_density", "optimal_makespan", "distance")


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
        "truncated": round(float(np.mean(np.asarray(v.truncated)[rows])) if n else 0.0, 4),
        "mean_tokens": round(float(np.mean(rollouts.lengths[rows])) if n else 0.0, 2),
        "mean_reward": round(float(np.mean(rollouts.rewards[rows])) if n else 0.0, 4),
    }


def _cut(text: str, chars: int) -> str:
    """The last `chars` characters of `text` ("..." before them when cut: a plan is read from
    the answer's last lines)."""
    return text if len(text) <= chars else "..." + text[len(text) - chars :]


def plan_lists(plans, i: int, agents: int) -> list:
    """Row `i` of Plans as per-agent action-name lists (None: the agent has no line)."""
    actions, lengths, present = (np.asarray(x[i]) for x in (plans.actions, plans.lengths, plans.present))
    return [
        [ACTION_NAMES[a] for a in actions[j, : min(int(lengths[j]), actions.shape[-1])]] if present[j] else None
        for j in range(agents)
    ]


def first_violation(board: dict, plan: list) -> str | None:
    """The first illegal move of `plan` (per-agent action-name lists, None: no line) on `board`,
    in words (the validator's rules, env/reference.py); without one, the first agent that does not
    end on its goal; None when neither happens."""
    run = reference.trajectory(board, plan)
    if run["events"]:
        t, kind, cells, agents = min(run["events"], key=lambda e: e[0])
        a, cell = agents[0], tuple(cells[0])
        if kind == "out_of_bounds":
            return f"step {t}: agent {a} left the grid (moving {plan[a][t - 1]} from {cell})"
        if kind == "hole":
            return f"step {t}: agent {a} fell into the hole at {cell}"
        if kind == "vertex_collision":
            return f"step {t}: agent {a} collided with agent {agents[1]} at {cell}"
        return f"step {t}: agent {a} swapped cells with agent {agents[1]} ({cell} <-> {tuple(cells[1])})"
    for a, (pos, goal) in enumerate(zip(run["positions"][-1], board["goals"])):
        if tuple(pos) != tuple(goal):
            return f"agent {a} ends at {tuple(pos)}, not on its goal {tuple(goal)}"
    return None


def failure_cases(rollouts, budget: int, chars: int = CASE_CHARS) -> list[dict]:
    """Up to `budget` invalid rows, spread over buckets (round robin), as raw evidence: each its
    board, the final answer (the text after `</think>`, as the parser reads it: its last
    chars // 2 characters), the plan read from it (at most chars // 2 characters), the characters
    of reasoning before the answer, the verdict flags and the first violation."""
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
        board, text = rollouts.boards[i], rollouts.texts[i]
        verdict = io.verdict_to_json(rollouts.verdicts, i)
        flags = [f for f in FLAGS if verdict[f]] or (["goals_not_reached"] if not verdict["all_goals_reached"] else [])
        answer = answer_text(text)
        plan = plan_lists(rollouts.plans, i, len(board["starts"]))
        lines = "\n".join(f"Agent {j}: {' '.join(p) if p is not None else '(no line)'}" for j, p in enumerate(plan))
        cases.append(
            {
                "bucket": int(board.get("bucket", 0)),
                "board": io.board_text(board),
                "answer": None if answer is None else _cut(answer.strip(), chars // 2),
                "reasoning_chars": len(text) - (0 if answer is None else len(answer)),
                "plan": lines[: chars // 2] if any(p is not None for p in plan) else None,
                "verdict": flags,
                "parse_status": ParseStatus(int(rollouts.plans.parse_status[i])).name.lower(),
                "violation": first_violation(board, plan) if any(p is not None for p in plan) else None,
            }
        )
    return cases


def board_sums(boards: Sequence[dict]) -> dict:
    """Per bucket (its id as a string) the number of `boards` and the sums of BOARD_STATS over
    them: side, agents, hole density, certified optimal makespan (boards without one left out of
    that sum and of `with_optimum`), mean Manhattan distance of an agent to its goal."""
    out: dict[str, dict] = {}
    for b in boards:
        s = out.setdefault(str(int(b.get("bucket", 0))), dict.fromkeys(("boards", "with_optimum", *BOARD_STATS), 0))
        k = len(b["starts"])
        s["boards"] += 1
        s["size"] += b["size"]
        s["agents"] += k
        s["hole_density"] += len(b["holes"]) / b["size"] ** 2
        if b.get("optimal_makespan", -1) >= 0:
            s["with_optimum"] += 1
            s["optimal_makespan"] += b["optimal_makespan"]
        s["distance"] += sum(abs(p[0] - g[0]) + abs(p[1] - g[1]) for p, g in zip(b["starts"], b["goals"])) / max(k, 1)
    return out


def environment_stats(sums: Sequence[dict], replaced: dict | None = None) -> list[dict]:
    """`board_sums` results (e.g. one per GRPO step) merged -> per bucket {"bucket", "boards",
    and the mean of each BOARD_STATS}, by bucket id; with `replaced` (`CertifyStats.replaced` of
    the draw the boards came from) also "replaced": the share of the bucket's generated boards
    the certified generator dropped (no joint plan within the horizon) and replaced."""
    total: dict[str, dict] = {}
    for part in sums:
        for bucket, s in part.items():
            t = total.setdefault(bucket, dict.fromkeys(s, 0))
            for k, v in s.items():
                t[k] += v
    out = []
    for bucket, t in sorted(total.items(), key=lambda kv: int(kv[0])):
        n = max(t["boards"], 1)
        means = {k: round(t[k] / n, 3) for k in BOARD_STATS if k != "optimal_makespan"}
        means["optimal_makespan"] = round(t["optimal_makespan"] / t["with_optimum"], 3) if t["with_optimum"] else None
        row = {"bucket": int(bucket), "boards": t["boards"], **{k: means[k] for k in BOARD_STATS}}
        if replaced is not None:
            c = replaced.get(bucket, {"generated": 0})
            row["replaced"] = round(c["replaced"] / c["generated"], 4) if c["generated"] else None
        out.append(row)
    return out


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

    OPTIONAL = ("environment",)

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
    # {"trained": the boards of the stage's updates, "evaluated": the held-out boards}, each
    # `environment_stats` (absent in accounts of older runs)
    environment: dict | None = None

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
    replaced: dict | None = None,
) -> Account:
    """The account of one stage's held-out evaluation (rollouts' boards carry "bucket", one row
    per board); `trajectory`: one dict of TRAJECTORY values per GRPO step of the stage, with the
    `board_sums` of the boards it trained on under "env" (steps without it are left out) and
    step 0 the training pool's `CertifyStats.replaced` under "replaced"; `replaced`: the held-out
    draw's."""
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
        environment={
            "trained": environment_stats(
                [t["env"] for t in trajectory if "env" in t],
                next((t["replaced"] for t in trajectory if "replaced" in t), None),
            ),
            "evaluated": environment_stats([board_sums(rollouts.boards)], replaced),
        },
    )


def case_text(case: dict) -> str:
    """A failure case as prompt text (older accounts' cases have the answer's start only)."""
    lines = [f"Failure (bucket {case['bucket']}, {', '.join(case['verdict']) or case['parse_status']}):", case["board"]]
    if case.get("reasoning_chars"):
        lines.append(f"(after {case['reasoning_chars']} characters of reasoning)")
    answer = "(none: the think block never closed)" if case["answer"] is None else case["answer"] or "(empty)"
    lines.append(f"Answer: {answer}")
    if "plan" in case:
        lines.append(f"Plan read: {case['plan'] or '(no plan line)'} [{case['parse_status']}]")
        lines.append(f"First violation: {case['violation'] or '-'}")
    return "\n".join(lines)


def account_text(account: dict, evidence: str | None = None, sections: Sequence[str] = SECTIONS) -> str:
    """The account as prompt text, the `sections` named (SECTIONS order). `evidence` replaces the
    raw failure cases (the model's own summary, for the summarised-evidence ablation)."""
    lines = [f"Stage {account['stage']} results. Reward weights: {json.dumps(account['reward_weights'])}"]
    if "statistics" in sections:
        o = account["overall"]
        lines.append(
            f"Overall: valid {o['valid']:.2f}, optimal {o['optimal']:.2f}, mean tokens {o['mean_tokens']:.0f}, "
            f"cut by the token budget {o.get('truncated', 0.0):.2f}"
        )
        for b in account["buckets"]:
            fails = {k: v for k, v in b["failures"].items() if v}
            change = "" if b["change_in_valid"] is None else f", change {b['change_in_valid']:+.2f}"
            lines.append(
                f"Bucket {b['bucket']} {json.dumps(b['config'])}: {b['boards']} boards, valid "
                f"{b['valid']:.2f} {b['valid_ci']}, optimal {b['optimal']:.2f}{change}, failures "
                f"{json.dumps(fails)}, mean tokens {b['mean_tokens']:.0f}, truncated {b.get('truncated', 0.0):.2f}"
            )
        for name, rows in (account.get("environment") or {}).items():
            for e in rows:
                optimum = "-" if e["optimal_makespan"] is None else f"{e['optimal_makespan']:.1f}"
                lines.append(
                    f"Boards {name}, bucket {e['bucket']}: {e['boards']} boards, mean size {e['size']:.1f}, "
                    f"agents {e['agents']:.1f}, hole density {e['hole_density']:.2f}, optimal makespan "
                    f"{optimum}, distance to goal {e['distance']:.1f}"
                    + ("" if e.get("replaced") is None else f", replaced by the generator {e['replaced']:.2f}")
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
            lines.append(case_text(c))
    if "history" in sections:
        for h in account["history"]:
            lines.append(f"Earlier: stage {h['stage']} config {json.dumps(h['config'])} -> valid {h['valid']:.2f}")
    lines.append(f"Legal ranges: {json.dumps(account['legal_ranges'])}")
    return "\n".join(lines)
