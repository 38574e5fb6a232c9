"""The engineer's proposal: a prompt from the failure account, decoded by the policy itself,
constrained to the proposal schema, then checked semantically. Never trusted blindly.

A proposal is JSON::

    {"edits": [{"bucket": 0, "size": [3, 5], "agents": [2, 2], "hole_density": [0.1, 0.3],
                "min_distance": 1, "weight": 1.0}, ...],
     "reward_weights": {"valid": 1.0, "optimal": 0.5, "efficiency": 0.0, "length": 0.0}}

Edit modes (`EDIT_MODES`): `selective` — an edit with `bucket` i < n replaces bucket i, `bucket`
n (one past the last) adds a bucket, and every bucket not named is kept unchanged; `rewrite` —
the edits are the new config. The schema (`proposal_schema`) enumerates every legal value, each
range as an ordered pair [low, high] (with free pairs the tiny embedded policy wrote `[0.1, 0.0]`
and most of its proposals were rejected for it), so constrained decoding always yields
well-formed, in-range JSON; `apply_proposal` still checks everything (low <= high, feasibility
of each bucket, the allowed agent range, distinct bucket ids, a positive valid weight) and
normalises the bucket weights. An unusable proposal falls back to the previous config, with the
reason recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence

from t2t_jax.engineer.context import SECTIONS, account_text, case_text
from t2t_jax.env.config import ConfigError, EnvConfig, bucket_from_json
from t2t_jax.text.parsing import END_THINK, THINK, answer_text

EDIT_MODES = ("selective", "rewrite")
MAX_BUCKETS = 16  # buckets a proposal may leave in the config
DENSITIES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
WEIGHTS = (0.5, 1.0, 2.0, 3.0)
REWARD_VALUES = (0.0, 0.1, 0.2, 0.5, 1.0)
PROPOSED_REWARDS = ("valid", "optimal", "efficiency", "length")
MAX_MIN_DISTANCE = 6

SYSTEM = (
    "You are the environment engineer of a reinforcement-learning curriculum for multi-agent "
    "path finding. You read how the policy did and propose the next stage's environment."
)
COMMON = (
    "Aim at the competence frontier: boards the policy solves sometimes, not always and not never. "
    "Move reward weight from valid towards optimal and efficiency once plans are mostly valid."
)
# Each edit mode its own instructions (the selective-vs-rewrite ablation differs in nothing else).
INSTRUCTIONS = {
    "selective": (
        "Propose the next stage's environment as JSON. Edit only the buckets that fail (name them by "
        "their bucket number; one past the last adds a bucket); every bucket you do not name is kept "
        "as it is. " + COMMON
    ),
    "rewrite": (
        "Propose the next stage's environment as JSON: the complete list of its buckets, numbered "
        "from 0. Buckets you do not list are dropped. " + COMMON
    ),
}


class ProposalError(ValueError):
    """A proposal that cannot become the next config; the message is the recorded reason."""


def proposal_schema(config: EnvConfig, agent_range: tuple[int, int], max_edits: int = 4) -> dict:
    """The JSON schema of a proposal for `config` (every value enumerated)."""

    def ints(lo, hi):
        return {"enum": list(range(lo, hi + 1))}

    def ordered_pairs(values):  # [low, high] with low <= high: no range the check must reject
        return {"enum": [[lo, hi] for i, lo in enumerate(values) for hi in values[i:]]}

    edit = {
        "type": "object",
        "properties": {
            "bucket": ints(0, len(config.buckets)),
            "size": ordered_pairs(list(range(3, config.max_size + 1))),
            "agents": ordered_pairs(list(range(agent_range[0], agent_range[1] + 1))),
            "hole_density": ordered_pairs(list(DENSITIES)),
            "min_distance": ints(0, MAX_MIN_DISTANCE),
            "weight": {"enum": list(WEIGHTS)},
        },
    }
    edit["required"] = list(edit["properties"])
    rewards = {
        "type": "object",
        "properties": {k: {"enum": list(REWARD_VALUES)} for k in PROPOSED_REWARDS},
        "required": list(PROPOSED_REWARDS),
    }
    return {
        "type": "object",
        "properties": {
            "edits": {"type": "array", "items": edit, "minItems": 1, "maxItems": max_edits},
            "reward_weights": rewards,
        },
        "required": ["edits", "reward_weights"],
    }


def parse_proposal(text: str):
    """The proposal's JSON; ProposalError for any text that is not JSON (1,000-deep nesting too)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ProposalError(f"not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None


def apply_proposal(
    proposal: dict, config: EnvConfig, reward_weights: dict, mode: str, agent_range: tuple[int, int], max_edits: int = 4
) -> tuple[EnvConfig, dict]:
    """-> (next EnvConfig with normalised weights, next reward weights); ProposalError with the
    reason for anything unusable, whatever the decoding mode: at most `max_edits` edits and
    MAX_BUCKETS buckets."""
    if mode not in EDIT_MODES:
        raise ValueError(f"engineer.edit_mode: {mode!r} is not one of {EDIT_MODES}")
    if not isinstance(proposal, dict) or not isinstance(proposal.get("edits"), list) or not proposal["edits"]:
        raise ProposalError("edits: expected a non-empty list")
    if len(proposal["edits"]) > max_edits:
        raise ProposalError(f"edits: {len(proposal['edits'])} edits, at most {max_edits} (engineer.max_edits)")
    n = len(config.buckets)
    buckets = list(config.buckets) if mode == "selective" else []
    seen = set()
    for j, edit in enumerate(proposal["edits"]):
        if not isinstance(edit, dict):
            raise ProposalError(f"edits[{j}]: expected an object")
        fields = dict(edit)
        target = fields.pop("bucket", n)
        if mode == "selective":
            if not isinstance(target, int) or not 0 <= target <= n:
                raise ProposalError(f"edits[{j}].bucket: {target!r} is outside the legal range [0, {n}]")
            if target in seen and target < n:
                raise ProposalError(f"edits[{j}].bucket: bucket {target} is edited twice")
            seen.add(target)
        try:
            bucket = bucket_from_json(fields, f"edits[{j}]")
        except ConfigError as e:
            raise ProposalError(str(e)) from None
        lo, hi = bucket.agents
        if lo < agent_range[0] or hi > agent_range[1]:
            raise ProposalError(
                f"edits[{j}].agents: {[lo, hi]} is outside the allowed range {list(agent_range)} (engineer.agent_range)"
            )
        if mode == "selective" and target < n:
            buckets[target] = bucket
        else:
            buckets.append(bucket)
    if len(buckets) > MAX_BUCKETS:
        raise ProposalError(f"edits: the config would have {len(buckets)} buckets, at most {MAX_BUCKETS}")
    total = sum(b.weight for b in buckets)
    buckets = [dataclasses.replace(b, weight=round(b.weight / total, 4)) for b in buckets]
    try:
        new = EnvConfig(buckets=tuple(buckets), max_size=config.max_size, max_agents=config.max_agents)
    except ConfigError as e:
        raise ProposalError(str(e)) from None
    weights = dict(reward_weights)
    proposed = proposal.get("reward_weights", {})
    for k in PROPOSED_REWARDS:
        if k in proposed:
            v = proposed[k]
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ProposalError(f"reward_weights.{k}: {v!r} is outside the legal range [0, 1]")
            weights[k] = float(v)
    if weights.get("valid", 0.0) <= 0.0:
        raise ProposalError("reward_weights.valid: must be > 0 (the policy needs an accuracy signal)")
    return new, weights


def engineer_messages(
    account: dict, evidence: str | None = None, mode: str = "selective", sections: Sequence[str] = SECTIONS
) -> list[dict]:
    """The proposal prompt: the account's `sections` as text, then `mode`'s instructions."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{account_text(account, evidence, sections)}\n{INSTRUCTIONS[mode]}"},
    ]


def summary_messages(account: dict) -> list[dict]:
    """The prompt that asks the model to summarise its raw failure cases (the ablation)."""
    cases = "\n".join(case_text(c) for c in account["failure_cases"])
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Summarise in two sentences what went wrong in these failed plans:\n{cases}"},
    ]


def split_reply(text: str) -> tuple[str | None, str]:
    """A reply -> (its reasoning: the think block's text, None without one; the answer: the text
    after the last `</think>`, as the plan parser reads it, text.parsing.answer_text; "" while a
    think block is still open)."""
    answer = answer_text(text)
    if END_THINK not in text and THINK not in text:
        return None, text
    reasoning = text.rsplit(END_THINK, 1)[0] if answer is not None else text
    return reasoning.replace(THINK, "", 1).strip(), answer or ""


@functools.lru_cache(maxsize=16)
def _constraint(schema_json: str, tokenizer, thinking: int, opened: bool):
    from outlines_core.json_schema import build_regex_from_schema

    from t2t_jax.sampling.constrained import Constraint, think_then

    if thinking < 0:
        return Constraint.from_json_schema(schema_json, tokenizer)
    # after </think> Qwen3 writes a blank line before its answer: up to two newlines allowed
    answer = Constraint.from_regex(r"\n{0,2}" + build_regex_from_schema(schema_json, whitespace_pattern=""), tokenizer)
    think, end = (tokenizer.get_vocab().get(t) for t in (THINK, END_THINK))
    if think is None or end is None:
        raise ValueError(f"engineer.thinking: the tokenizer has no {THINK} / {END_THINK} token")
    return think_then(answer, think, end, thinking, opened)


def constraint_for(schema: dict, tokenizer, thinking: int = -1, opened: bool = False):
    """The compiled (and cached) token automaton of a proposal schema; with `thinking` >= 0 the
    schema holds after a think block of at most that many free tokens (`constrained.think_then`;
    `opened`: the prompt already opened it)."""
    return _constraint(json.dumps(schema, sort_keys=True), tokenizer, thinking, opened)
