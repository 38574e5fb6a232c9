"""`Engineer`: the next stage's config from a failure account, by any of `KINDS`.

`self` decodes the proposal with the current policy's parameters (the paper's method), `base`
with the parameters the GRPO phase started from (after the warm start; the ablation), `api`
asks a served model (`engineer.api_base`, `engineer.model`: any OpenAI-compatible endpoint,
the proposal schema sent as the structured-output `response_format`, serving/client.py); all
three go through `propose.apply_proposal`. A failed API call (after `engineer.api_retries`)
is a rejected proposal with the reason recorded, never a crash. The others
are the baselines of baselines.py. Every call returns a record (JSON-ready) with the prompt,
the text, the parsed proposal, whether it was accepted and why, and the resulting config and
reward weights; an unusable proposal keeps the previous config.

Reward guard (the paper's rule, `reward_guard`, on by default): until the held-out valid rate
reaches `efficiency_threshold`, a `self` / `base` / `api` proposal's reward weights are replaced by the
accuracy-first ones (`baselines.reward_schedule`, as the baselines use), and the record says so.

Ablations (engineer config): `sections` (which sections of the account the prompt shows:
statistics, breakdown, training, cases, history; context.SECTIONS), `breakdown_cells` (the
worst cells shown; 0 = off), `failure_cases` (raw cases in the context, a count; 0 = off),
`evidence` (`raw` cases or `summary`: the same model first summarises them and only its
summary is shown), `edit_mode` (selective / rewrite), `constrained` (decode under the proposal
schema, or free text that must parse as JSON). Each edit mode has its own instructions
(propose.INSTRUCTIONS).

Thinking (`thinking`, kinds `self` / `base`): the proposal is decoded in thinking mode, free
reasoning of at most `thinking_tokens` tokens inside `<think>...</think>` (closed by force at the
budget), then the answer, under the schema when `constrained` (one decode:
`constrained.think_then`), within `max_tokens`. The record keeps the reasoning and the answer
apart (`reasoning`, `text`); only the answer is parsed. Any reply with a think block (an `api`
model's too) is split the same way. The summary of `evidence=summary` is decoded without thinking.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from t2t_jax.engineer import baselines, context, propose
from t2t_jax.env.config import EnvConfig
from t2t_jax.jsonrecord import JsonRecord
from t2t_jax.text.parsing import THINK
from t2t_jax.text.prompts import encode_texts

KINDS = ("self", "base", "api") + tuple(baselines.BASELINES)
EVIDENCE = ("raw", "summary")


@dataclasses.dataclass(frozen=True, eq=False)
class Proposal(JsonRecord):
    """One engineer call's record (a line of proposals.jsonl): its settings, the prompt, the
    model's text and parsed proposal, whether it was accepted and why, and the next stage's
    config and reward weights (the previous ones when rejected)."""

    OPTIONAL = ("api_calls", "reasoning")

    stage: int  # the stage whose account it read
    kind: str  # engineer.kind
    edit_mode: str
    evidence: str
    failure_cases: int
    constrained: bool
    prompt: str | None  # the account as the model read it (None for the baselines)
    summary: str | None  # the model's own summary of its failure cases (evidence = summary)
    text: str | None  # the model's answer (after </think> when it thought)
    parsed: dict | None  # the reply as JSON
    accepted: bool
    reason: str
    api_calls: list | None  # kind api: each call's attempts, structured-output fallback, tokens
    config: dict  # the next stage's EnvConfig JSON
    reward_weights: dict
    reasoning: str | None = None  # the think block's text (engineer.thinking; absent without one)


class Engineer:
    """Args:
    config: the `engineer` ConfigDict (kind, edit_mode, evidence, failure_cases, constrained,
      max_tokens, thinking, thinking_tokens, temperature, top_p, agent_range, max_edits,
      efficiency_threshold; api_base,
      model, api_key_env, api_timeout, api_retries for kind `api`).
    policy: a rollout.Policy (its sampler and tokenizer decode proposals).
    base_params: the parameters the GRPO phase started from (for kind `base`; the stage loop
      sets them once the warm start is done).
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
        self.client, self.api_calls = None, []
        if config.kind == "api":
            from t2t_jax.serving.client import ChatClient

            key = os.environ.get(config.api_key_env) if config.api_key_env else None
            self.client = ChatClient(
                config.api_base, config.model, api_key=key, timeout=config.api_timeout, retries=config.api_retries
            )

    def _decode(self, params, messages, schema, seed, thinking: bool = False) -> tuple[str, bool]:
        """(text, truncated) of one reply under `schema` (a JSON schema, or None for free text);
        `thinking`: reasoning of up to `thinking_tokens` first, the schema holding for the answer."""
        c = self.config
        if self.client is not None:
            from t2t_jax.serving.client import Request, json_schema_format

            fmt = json_schema_format(schema, "proposal") if schema is not None else None
            reply = self.client.complete(
                Request(tuple(messages), c.max_tokens, c.temperature, c.top_p, seed=seed, response_format=fmt)
            )
            self.api_calls.append(
                {k: getattr(reply, k) for k in ("attempts", "schema_dropped", "prompt_tokens", "completion_tokens")}
            )
            if reply.error:
                raise propose.ProposalError(f"the API call failed after {reply.attempts} attempts ({reply.error})")
            return reply.text, reply.finish_reason == "length"
        tok = self.policy.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
        budget = c.thinking_tokens if thinking else -1  # (-1: no think block)
        opened = text.rstrip().endswith(THINK)  # (templates that open the think block themselves)
        constraint = propose.constraint_for(schema, tok, budget, opened) if schema is not None else None
        ids, mask = encode_texts(tok, [text], self.policy.buckets)
        out = self.policy.sampler.generate(
            ids,
            mask,
            max_new_tokens=c.max_tokens + budget + 2 if thinking else c.max_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            seed=seed,
            constraint=constraint,
            params=params,
            check=self.policy.check,
        )
        lengths = np.asarray(out.lengths)
        return self.policy.decode(np.asarray(out.tokens), lengths)[0], bool(out.truncated[0])

    def propose(self, params, account, config: EnvConfig, first: EnvConfig, reward_weights: dict) -> Proposal:
        """The record of one proposal for the stage after `account["stage"]` (a context.Account,
        or its JSON)."""
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
            return Proposal.from_json(
                record | {"accepted": True, "reason": reason, "config": new.to_json(), "reward_weights": weights}
            )
        params = params if c.kind == "self" else self.base_params
        if self.client is not None:  # each API call's attempts, structured-output fallback, tokens
            self.api_calls = record["api_calls"] = []
        try:
            evidence = None
            if c.evidence == "summary" and account["failure_cases"]:
                evidence, _ = self._decode(params, propose.summary_messages(account), None, self.seed + stage)
                account = {**account, "failure_cases": []}
                record["summary"] = evidence
            messages = propose.engineer_messages(account, evidence, c.edit_mode, context.parse_sections(c.sections))
            record["prompt"] = messages[-1]["content"]
            schema = propose.proposal_schema(config, self.agent_range, c.max_edits)
            thinking = bool(getattr(c, "thinking", False))
            reply, truncated = self._decode(
                params, messages, schema if c.constrained else None, self.seed + 1000 + stage, thinking
            )
            record["reasoning"], record["text"] = propose.split_reply(reply)
            text = record["text"]
            if truncated:
                budget = f" + engineer.thinking_tokens = {c.thinking_tokens}" if thinking else ""
                raise propose.ProposalError(f"truncated at engineer.max_tokens = {c.max_tokens}{budget}")
            record["parsed"] = parsed = propose.parse_proposal(text)
            new, weights = propose.apply_proposal(
                parsed, config, reward_weights, c.edit_mode, self.agent_range, c.max_edits
            )
        except propose.ProposalError as e:
            return Proposal.from_json(
                record
                | {
                    "reason": f"rejected: {e}; previous config kept",
                    "config": config.to_json(),
                    "reward_weights": dict(reward_weights),
                }
            )
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
        return Proposal.from_json(
            record | {"accepted": True, "reason": reason, "config": new.to_json(), "reward_weights": weights}
        )
