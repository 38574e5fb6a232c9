"""`Engineer`: the next stage's config from a failure account, by any of `KINDS`.

`self` decodes the proposal with the current policy's parameters (the paper's method), `base`
with the initial parameters (ablation); both go through `propose.apply_proposal`. The others
are the baselines of baselines.py. Every call returns a record (JSON-ready) with the prompt,
the text, the parsed proposal, whether it was accepted and why, and the resulting config and
reward weights; an unusable proposal keeps the previous config.

Reward guard (the paper's rule, `reward_guard`, on by default): until the held-out valid rate
reaches `efficiency_threshold`, a `self` / `base` proposal's reward weights are replaced by the
accuracy-first ones (`baselines.reward_schedule`, as the baselines use), and the record says so.

Ablations (engineer config): `sections` (which sections of the account the prompt shows:
statistics, breakdown, training, cases, history; context.SECTIONS), `breakdown_cells` (the
worst cells shown; 0 = off), `failure_cases` (raw cases in the context, a count; 0 = off),
`evidence` (`raw` cases or `summary`: the same model first summarises them and only its
summary is shown), `edit_mode` (selective / rewrite), `constrained` (decode under the proposal
schema, or free text that must parse as JSON). Each edit mode has its own instructions
(propose.INSTRUCTIONS).
"""

from __future__ import annotations

import numpy as np

from t2t_jax.engineer import baselines, context, propose
from t2t_jax.env.config import EnvConfig
from t2t_jax.text.prompts import encode_texts

KINDS = ("self", "base") + tuple(baselines.BASELINES)
EVIDENCE = ("raw", "summary")


class Engineer:
    """Args:
    config: the `engineer` ConfigDict (kind, edit_mode, evidence, failure_cases, constrained,
      max_tokens, temperature, top_p, agent_range, max_edits, efficiency_threshold).
    policy: a rollout.Policy (its sampler and tokenizer decode proposals).
    base_params: the initial parameters (for kind `base`).
    seed: base seed; stage s decodes with seed + s.
    """

    def __init__(self, config, policy, base_params=None, seed: int = 0):
        if config.kind not in KINDS:
            raise ValueError(f"engineer.kind: {config.kind!r} is not one of {KINDS}")
        if config.evidence not in EVIDENCE:
            raise ValueError(f"engineer.evidence: {config.evidence!r} is not one of {EVIDENCE}")
        if config.edit_mode not in propose.EDIT_MODES:
            raise ValueError(f"engineer.edit_mode: {config.edit_mode!r} is not one of {propose.EDIT_MODES}")
        self.config, self.policy, self.base_params, self.seed = config, policy, base_params, seed
        self.agent_range = tuple(config.agent_range)

    def _decode(self, params, messages, constraint, seed) -> tuple[str, bool]:
        tok = self.policy.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids, mask = encode_texts(tok, [text], self.policy.buckets)
        out = self.policy.sampler.generate(
            ids,
            mask,
            max_new_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=seed,
            constraint=constraint,
            params=params,
        )
        lengths = np.asarray(out.lengths)
        return self.policy.decode(np.asarray(out.tokens), lengths)[0], bool(out.truncated[0])

    def propose(self, params, account: dict, config: EnvConfig, first: EnvConfig, reward_weights: dict) -> dict:
        """The record of one proposal for the stage after `account["stage"]`."""
        c, stage = self.config, account["stage"]
        record = {
            "stage": stage,
            "kind": c.kind,
            "edit_mode": c.edit_mode,
            "evidence": c.evidence,
            "failure_cases": c.failure_cases,
            "constrained": c.constrained,
            "prompt": None,
            "summary": None,
            "text": None,
            "parsed": None,
            "accepted": False,
            "reason": "",
        }
        if c.kind in baselines.BASELINES:
            rng = np.random.default_rng([self.seed, stage])
            new, reason = baselines.BASELINES[c.kind](account, config, first, rng, self.agent_range)
            weights = {
                **reward_weights,
                **baselines.reward_schedule(account["overall"]["valid"], c.efficiency_threshold),
            }
            return record | {"accepted": True, "reason": reason, "config": new.to_json(), "reward_weights": weights}
        params = params if c.kind == "self" else self.base_params
        evidence = None
        if c.evidence == "summary" and account["failure_cases"]:
            evidence, _ = self._decode(params, propose.summary_messages(account), None, self.seed + stage)
            account = {**account, "failure_cases": []}
            record["summary"] = evidence
        messages = propose.engineer_messages(account, evidence, c.edit_mode, context.parse_sections(c.sections))
        record["prompt"] = messages[-1]["content"]
        schema = propose.proposal_schema(config, self.agent_range, c.max_edits)
        constraint = propose.constraint_for(schema, self.policy.tokenizer) if c.constrained else None
        text, truncated = self._decode(params, messages, constraint, self.seed + 1000 + stage)
        record["text"] = text
        try:
            if truncated:
                raise propose.ProposalError(f"truncated at engineer.max_tokens = {c.max_tokens}")
            record["parsed"] = parsed = propose.parse_proposal(text)
            new, weights = propose.apply_proposal(
                parsed, config, reward_weights, c.edit_mode, self.agent_range, c.max_edits
            )
        except propose.ProposalError as e:
            return record | {
                "reason": f"rejected: {e}; previous config kept",
                "config": config.to_json(),
                "reward_weights": dict(reward_weights),
            }
        reason = "accepted"
        valid = account["overall"]["valid"]
        if getattr(c, "reward_guard", True) and valid < c.efficiency_threshold:
            guarded = baselines.reward_schedule(valid, c.efficiency_threshold)
            if weights != {**weights, **guarded}:
                reason = (
                    f"accepted; reward_weights set accuracy-first: held-out valid {valid:.2f} < "
                    f"engineer.efficiency_threshold {c.efficiency_threshold} (engineer.reward_guard)"
                )
            weights = {**weights, **guarded}
        return record | {"accepted": True, "reason": reason, "config": new.to_json(), "reward_weights": weights}
