"""Boards -> chat prompts -> left-padded token ids.

The user message states the rules of MAPF-FrozenLake, the grid in the text form of the design
(rows of `.` frozen and `H` hole, row 0 at the top), each agent's start and goal, and the exact
answer format (`Agent i: ACTION ACTION ...`, one line per agent). Token ids come from the
tokenizer's own chat template (Qwen3's `<|im_start|>` format), with `enable_thinking` on or off.

Styles (`PROMPT_STYLES`): `full` (system message, rules, format; what a pretrained model needs),
`compact` (the board's text form alone, about a third of the tokens: for small models that
learn the format from SFT and could not use the prose anyway) and `offsets` (compact plus each
agent's displacement in action words, `Agent 0 goal: 2 UP 1 RIGHT`: coordinates arithmetic a
3M-parameter model cannot learn in CPU minutes, stated outright).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from t2t_jax.env.io import board_text

SYSTEM = "You are a careful planner for multi-agent path finding."
RULES = (
    "Rules: all agents move at the same time, one action per step: UP (row - 1), DOWN (row + 1), "
    "LEFT (column - 1), RIGHT (column + 1) or STAY. No agent may leave the map or enter a hole. "
    "Two agents may never be in the same cell at the same time, and two agents may never swap "
    "cells in one step; an agent may move into a cell that another agent leaves in the same "
    "step. An agent whose actions have run out stays where it is, and it must then be on its "
    "goal. Reach every goal in as few steps as possible."
)
# Lengths that prompt batches are padded to, so the sampler compiles a handful of shapes.
LENGTH_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
PROMPT_STYLES = ("full", "compact", "offsets")


def board_prompt(board: dict, style: str = "full") -> str:
    """The user message for one board (an interchange dict, see t2t_jax.env.io)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style: {style!r} is not one of {PROMPT_STYLES}")
    if style == "compact":
        return board_text(board)
    if style == "offsets":
        lines = [board_text(board)]
        for i, (s, g) in enumerate(zip(board["starts"], board["goals"])):
            dr, dc = g[0] - s[0], g[1] - s[1]
            lines.append(
                f"Agent {i} goal: {abs(dr)} {'DOWN' if dr > 0 else 'UP'} {abs(dc)} {'RIGHT' if dc > 0 else 'LEFT'}"
            )
        return "\n".join(lines)
    n, k = board["size"], len(board["starts"])
    example = "\n".join(f"Agent {i}: ACTION ACTION ..." for i in range(k))
    return (
        f"Plan paths for {k} agents on a {n}x{n} frozen lake. Row 0 is the top row and "
        f"column 0 the left column; cells are (row, column).\n"
        f"Map ('.' is frozen ice, 'H' is a hole):\n{board_text(board)}\n{RULES}\n"
        f"Answer with exactly one line per agent in this format:\n{example}"
    )


def chat_messages(board: dict, style: str = "full") -> list[dict]:
    user = [{"role": "user", "content": board_prompt(board, style)}]
    return [{"role": "system", "content": SYSTEM}] + user if style == "full" else user


def render_chat(tokenizer, board: dict, enable_thinking: bool, style: str = "full") -> str:
    """The prompt text through the tokenizer's chat template, ready for generation."""
    return tokenizer.apply_chat_template(
        chat_messages(board, style), tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )


def bucket_length(length: int, buckets: Sequence[int] = LENGTH_BUCKETS) -> int:
    """The smallest bucket >= length (multiples of the largest beyond it)."""
    for b in buckets:
        if length <= b:
            return b
    top = buckets[-1]
    return -(-length // top) * top


def encode_prompts(
    tokenizer,
    boards: Sequence[dict],
    enable_thinking: bool = False,
    buckets: Sequence[int] = LENGTH_BUCKETS,
    style: str = "full",
) -> tuple[np.ndarray, np.ndarray]:
    """Boards -> (input_ids [B, L] int32, attention_mask [B, L] bool), left-padded with the
    tokenizer's pad id to the bucketed length L of the longest prompt."""
    texts = [render_chat(tokenizer, b, enable_thinking, style) for b in boards]
    return encode_texts(tokenizer, texts, buckets)


def encode_texts(tokenizer, texts: Sequence[str], buckets: Sequence[int] = LENGTH_BUCKETS):
    """Rendered prompt texts -> (input_ids [B, L], attention_mask [B, L]), left-padded."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    length = bucket_length(max(len(x) for x in ids), buckets)
    out = np.full((len(ids), length), tokenizer.pad_token_id, np.int32)
    mask = np.zeros((len(ids), length), bool)
    for i, x in enumerate(ids):
        out[i, length - len(x) :] = x
        mask[i, length - len(x) :] = True
    return out, mask
