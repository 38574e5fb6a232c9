"""Boards -> prompts -> sampled completions -> Plans -> Verdicts -> reward terms.

    policy = Policy(sampler, tokenizer, max_size=10, max_agents=5, horizon=64)
    out = policy.rollout(params, boards, n=8, max_new_tokens=256, temperature=1.0, seed=step,
                         reward_weights={"valid": 1.0, ...})
    out.batch()   # the arrays a Trainer update takes (advantages added by the caller)

Row i * n + j of every output is sample j of board i. Text stays on the host (decoding,
parsing); validation and rewards are jitted over the padded batch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from t2t_jax.env import io
from t2t_jax.env.types import Plans, Verdicts
from t2t_jax.env.validator import validate
from t2t_jax.perf import PhaseTimer
from t2t_jax.rl.rewards import reward_terms, total_reward
from t2t_jax.rl.sft import answer_tokens
from t2t_jax.text.parsing import parse_completions
from t2t_jax.text.prompts import LENGTH_BUCKETS, encode_prompts


@dataclasses.dataclass
class Rollouts:
    """One batch of B * n completions (numpy arrays, leading axis B * n)."""

    boards: list[dict]
    texts: list[str]
    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    plans: Plans
    verdicts: Verdicts
    terms: dict
    rewards: np.ndarray
    guided: np.ndarray  # [B * n] bool: the row is a certified plan put in by `guide`, not a sample

    def batch(self) -> dict:
        return {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "completion_ids": self.completion_ids,
            "completion_mask": self.completion_mask,
        }

    def select(self, rows: Sequence[int]) -> Rollouts:
        """The rows `rows`, in that order."""
        idx = np.asarray(rows, np.int64)
        pick = lambda x: jax.tree.map(lambda a: np.asarray(a)[idx], x)  # noqa: E731
        return Rollouts(
            boards=[self.boards[i] for i in idx],
            texts=[self.texts[i] for i in idx],
            prompt_ids=self.prompt_ids[idx],
            prompt_mask=self.prompt_mask[idx],
            completion_ids=self.completion_ids[idx],
            completion_mask=self.completion_mask[idx],
            logprobs=self.logprobs[idx],
            lengths=self.lengths[idx],
            truncated=self.truncated[idx],
            plans=pick(self.plans),
            verdicts=pick(self.verdicts),
            terms=pick(self.terms),
            rewards=self.rewards[idx],
            guided=self.guided[idx],
        )


def concat(parts: Sequence[Rollouts]) -> Rollouts:
    """Rows of several Rollouts in order (prompts left-padded to the widest; completions share
    one width, the token budget)."""
    width = max(p.prompt_ids.shape[1] for p in parts)
    left = lambda x: np.pad(x, ((0, 0), (width - x.shape[1], 0)))  # noqa: E731
    cat = lambda *xs: np.concatenate([np.asarray(x) for x in xs])  # noqa: E731
    fields = {
        f.name: jax.tree.map(cat, *[getattr(p, f.name) for p in parts])
        for f in dataclasses.fields(Rollouts)
        if f.name not in ("boards", "texts", "prompt_ids", "prompt_mask")
    }
    return Rollouts(
        boards=sum((p.boards for p in parts), []),
        texts=sum((p.texts for p in parts), []),
        prompt_ids=cat(*[left(p.prompt_ids) for p in parts]),
        prompt_mask=cat(*[left(p.prompt_mask) for p in parts]),
        **fields,
    )


@jax.jit
def _score(boards, plans, lengths, max_length):
    verdicts = validate(boards, plans)
    terms = reward_terms(verdicts, plans.parse_status, boards.optimal_makespan, boards.num_agents, lengths, max_length)
    return verdicts, terms


class Policy:
    """The text side of a policy: prompts in, scored completions out.

    Args:
      sampler: a `Sampler` over the policy model.
      tokenizer: the model's tokenizer (its pad id pads prompts).
      max_size, max_agents: the static padding of board batches.
      horizon: the longest plan the parser accepts (longer is TOO_LONG).
      enable_thinking: open a think block in the prompt (Qwen3's thinking mode).
      style: the prompt style (text.prompts.PROMPT_STYLES).
      buckets: prompt length buckets.
      check: called between decode chunks; may raise to stop (the stage loop's preemption).
      timer: where generation and scoring time is counted (the stage loop shares its own).
    """

    def __init__(
        self,
        sampler,
        tokenizer,
        max_size: int = 10,
        max_agents: int = 5,
        horizon: int = 64,
        enable_thinking: bool = False,
        style: str = "full",
        buckets: Sequence[int] = LENGTH_BUCKETS,
        check: Callable[[], None] | None = None,
        timer: PhaseTimer | None = None,
    ):
        self.sampler, self.tokenizer = sampler, tokenizer
        self.check, self.timer = check, timer or PhaseTimer()
        self.max_size, self.max_agents, self.horizon = max_size, max_agents, horizon
        self.enable_thinking, self.style, self.buckets = enable_thinking, style, tuple(buckets)

    def padded_to(self, max_agents: int) -> Policy:
        """The same policy for boards of up to `max_agents` agents (e.g. the 6-agent OOD set)."""
        if max_agents <= self.max_agents:
            return self
        wide = copy.copy(self)
        wide.max_agents = max_agents
        return wide

    def encode(self, boards: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Boards -> left-padded prompt ids and mask [B, P]."""
        return encode_prompts(self.tokenizer, boards, self.enable_thinking, self.buckets, self.style)

    def decode(self, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
        """Completion tokens -> text, the stop token dropped (special tokens such as </think>
        are kept: the parser needs them)."""
        stops = set(np.asarray(self.sampler.stop_ids).tolist())
        out = []
        for row, n in zip(tokens, lengths):
            ids = [int(t) for t in row[:n]]
            if ids and ids[-1] in stops:
                ids = ids[:-1]
            out.append(self.tokenizer.decode(ids, skip_special_tokens=False))
        return out

    def rollout(
        self,
        params,
        boards: Sequence[dict],
        *,
        n: int,
        max_new_tokens: int,
        reward_weights: Mapping[str, float],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> Rollouts:
        """Sample n completions per board and score them (boards carry `optimal_makespan`)."""
        ids, mask = self.encode(boards)
        with self.timer.phase("generation"):
            out = self.sampler.generate(
                ids,
                mask,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                n=n,
                seed=seed,
                params=params,
                check=self.check,
            )
            tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
            self.timer.add("generation", tokens=int(lengths.sum()))
        truncated = np.asarray(out.truncated)
        rows = [b for b in boards for _ in range(n)]
        with self.timer.phase("scoring"):  # (decoding the text, parsing, validating, rewards)
            return self.score(
                rows,
                self.decode(tokens, lengths),
                truncated,
                lengths,
                max_new_tokens,
                reward_weights,
                prompt=(np.repeat(ids, n, 0), np.repeat(mask, n, 0)),
                tokens=tokens,
                logprobs=np.asarray(out.logprobs),
            )

    def score(
        self, boards, texts, truncated, lengths, max_new_tokens, reward_weights, prompt, tokens, logprobs
    ) -> Rollouts:
        """Parse, validate and reward completions that are already decoded."""
        board_batch = io.boards_from_json(boards, self.max_size, self.max_agents)
        plans = parse_completions(
            texts, np.asarray(board_batch.num_agents).tolist(), self.max_agents, self.horizon, truncated.tolist()
        )
        verdicts, terms = _score(board_batch, plans, lengths, max_new_tokens)
        verdicts, terms, plans = jax.tree.map(np.asarray, (verdicts, terms, plans))
        rewards = np.asarray(total_reward(terms, reward_weights))
        completion_mask = np.arange(tokens.shape[1])[None] < lengths[:, None]
        return Rollouts(
            boards=list(boards),
            texts=texts,
            prompt_ids=prompt[0],
            prompt_mask=prompt[1],
            completion_ids=tokens,
            completion_mask=completion_mask,
            logprobs=logprobs,
            lengths=lengths,
            truncated=truncated,
            plans=plans,
            verdicts=verdicts,
            terms=terms,
            rewards=rewards,
            guided=np.zeros(len(texts), bool),
        )


def guide(
    policy: Policy, ro: Rollouts, group_size: int, max_new_tokens: int, reward_weights: Mapping[str, float]
) -> Rollouts:
    """Off-policy guidance: in every group without a valid sample, the last sample is replaced by
    the board's certified plan (its "plan" text and the end token, scored like a sample), so a
    group the policy fails entirely still has a success to move towards (LUFFY, Yan et al. 2025,
    mixes demonstrations into GRPO groups the same way). Plans longer than the completion width
    are not put in. Replaced rows have `guided` set and sampler log-probs 0 (the update must
    recompute old log-probs)."""
    width = ro.completion_ids.shape[1]
    failed = np.flatnonzero(~np.asarray(ro.verdicts.valid).reshape(-1, group_size).any(axis=1))
    rows, answers = [], []
    for g in failed:
        row = g * group_size + group_size - 1
        ids = answer_tokens(policy.tokenizer, ro.boards[row]["plan"])
        if len(ids) <= width:
            rows.append(row)
            answers.append(ids)
    if not rows:
        return ro
    tokens = np.full((len(rows), width), policy.tokenizer.pad_token_id, ro.completion_ids.dtype)
    for i, ids in enumerate(answers):
        tokens[i, : len(ids)] = ids
    lengths = np.array([len(a) for a in answers], ro.lengths.dtype)
    expert = policy.score(
        [ro.boards[r] for r in rows],
        [ro.boards[r]["plan"] for r in rows],
        np.zeros(len(rows), bool),
        lengths,
        max_new_tokens,
        reward_weights,
        prompt=(ro.prompt_ids[rows], ro.prompt_mask[rows]),
        tokens=tokens,
        logprobs=np.zeros(tokens.shape, ro.logprobs.dtype),
    )
    expert.guided[:] = True
    order = np.arange(len(ro.texts))
    order[rows] = len(ro.texts) + np.arange(len(rows))
    return concat([ro, expert]).select(order)
