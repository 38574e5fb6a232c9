"""SFT warm start: supervised fine-tuning on solver-optimal plans, loss on answer tokens only.

It exists so the small embedded model starts RL with a non-zero valid rate; for a pretrained
Qwen3-4B it is off by default (`sft.steps = 0`). Boards come from the stage's `EnvConfig` through
the `CertifiedGenerator`, so every target plan is a certified optimum. The answer is the plan
text followed by `<|im_end|>`, after the same chat prompt GRPO uses.

Targets (`SFT_TARGETS`): a board's optimal plans are many (move orders, waits), and the
solver's witness is an arbitrary one, which a small model learns slowly. Where the straight
plan (every agent all its vertical moves, then all its horizontal ones) is valid, it is optimal
(each agent moves its Manhattan distance, the lower bound). `canonical` makes it the target
there and keeps the witness elsewhere; `straight` keeps only those boards: one rule, turning each
agent's displacement into moves, with no witness detours to contradict it (what each gave the
embedded default: docs/experiments.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

from t2t_jax.env import io
from t2t_jax.env.validator import validate
from t2t_jax.text.tokenizer import IM_END


def straight_plan(board: dict) -> list[list[str]]:
    """Each agent: all vertical moves towards its goal, then all horizontal ones."""
    plan = []
    for (sr, sc), (gr, gc) in zip(board["starts"], board["goals"]):
        plan.append(["DOWN" if gr > sr else "UP"] * abs(gr - sr) + ["RIGHT" if gc > sc else "LEFT"] * abs(gc - sc))
    return plan


SFT_TARGETS = ("witness", "canonical", "straight")


def _straight_valid(boards, max_size, max_agents):
    """(straight plans as action lists, [B] bool: the plan is valid on its board)."""
    plans = [straight_plan(b) for b in boards]
    verdicts = validate(
        io.boards_from_json(boards, max_size, max_agents), io.plans_from_lists(plans, max_agents, 2 * max_size)
    )
    return plans, np.asarray(verdicts.valid)


def canonical_plans(boards: Sequence[dict], max_size: int = 10, max_agents: int = 5) -> list[dict]:
    """Boards with "plan" replaced by the straight plan where that is valid (then optimal)."""
    plans, valid = _straight_valid(boards, max_size, max_agents)
    return [{**b, "plan": io.plan_to_text(p)} if ok else b for b, p, ok in zip(boards, plans, valid)]


def straight_plans(boards: Sequence[dict], max_size: int = 10, max_agents: int = 5) -> list[dict]:
    """Only the boards whose straight plan is valid, with it as their "plan"."""
    plans, valid = _straight_valid(boards, max_size, max_agents)
    return [{**b, "plan": io.plan_to_text(p)} for b, p, ok in zip(boards, plans, valid) if ok]


def check_targets(targets: str) -> None:
    """The error for an `sft.targets` that is not one of SFT_TARGETS."""
    if targets not in SFT_TARGETS:
        raise ValueError(f"sft.targets: {targets!r} is not one of {SFT_TARGETS}")


def sft_targets(boards: Sequence[dict], targets: str, max_size: int = 10, max_agents: int = 5) -> list[dict]:
    """The SFT pool for `targets` (one of SFT_TARGETS) from certified boards."""
    check_targets(targets)
    if targets == "witness":
        return list(boards)
    pick = canonical_plans if targets == "canonical" else straight_plans
    return pick(boards, max_size, max_agents)


def answer_tokens(tokenizer, plan: str) -> list[int]:
    """A plan text as the policy would answer it: its tokens and the end token."""
    return tokenizer(plan + IM_END, add_special_tokens=False)["input_ids"]


def sft_batch(policy, boards: Sequence[dict], answer_length: int) -> dict:
    """Boards with a "plan" text -> a Trainer batch: prompts [B, P] as `policy` (a
    rollout.Policy) encodes them, answers [B, answer_length] right-padded (`completion_mask` 1
    on the answer and its end token). Answers longer than `answer_length` are cut (and lose
    their end token)."""
    tokenizer = policy.tokenizer
    ids, mask = policy.encode(boards)
    answers = np.full((len(boards), answer_length), tokenizer.pad_token_id, np.int32)
    answer_mask = np.zeros((len(boards), answer_length), bool)
    for i, b in enumerate(boards):
        toks = answer_tokens(tokenizer, b["plan"])[:answer_length]
        answers[i, : len(toks)] = toks
        answer_mask[i, : len(toks)] = True
    return {"prompt_ids": ids, "prompt_mask": mask, "completion_ids": answers, "completion_mask": answer_mask}


def batch_order(boards: int, batch_size: int, steps: int, seed: int | Sequence[int] = 0) -> np.ndarray:
    """[steps, batch_size] board indices: a seeded permutation of `boards`, epoch after epoch
    (seed: anything `np.random.default_rng` takes); step s's row depends only on (seed, s)."""
    rng = np.random.default_rng(seed)
    order, rows = np.array([], np.int64), []
    for _ in range(steps):
        while len(order) < batch_size:
            order = np.concatenate([order, rng.permutation(boards)])
        rows.append(order[:batch_size])
        order = order[batch_size:]
    return np.array(rows, np.int64).reshape(steps, batch_size)


def sft_update(trainer, state, policy, boards: Sequence[dict], answer_length: int):
    """One SFT update of `state` on `boards` (their "plan" texts): (new TrainState, metrics as
    host floats); raises TrainingError after too many non-finite updates in a row."""
    batch = trainer.shard(sft_batch(policy, boards, answer_length))
    state, metrics = trainer.update(state, batch)
    metrics = {k: float(v) for k, v in metrics.items()}
    trainer.check_finite(metrics)
    return state, metrics


def run_sft(
    trainer,
    state,
    policy,
    boards: Sequence[dict],
    *,
    steps: int,
    batch_size: int,
    answer_length: int,
    seed: int | Sequence[int] = 0,
    progress: bool = True,
):
    """SFT updates 0..steps-1 on batches of `batch_order` (the stage loop runs the same updates
    one at a time: rl/warm_start.py). Returns the new TrainState."""
    order = batch_order(len(boards), batch_size, steps, seed)
    for step in tqdm(range(steps), desc="sft", disable=not progress):
        state, _ = sft_update(trainer, state, policy, [boards[i] for i in order[step]], answer_length)
    return state
