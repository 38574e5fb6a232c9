"""Constrained decoding: a regex or JSON schema as a token automaton that lives on the device.

`outlines-core` compiles the regex (JSON schemas go through its `build_regex_from_schema`) into
an index over the tokenizer's vocabulary: states, and per state the tokens that keep the text a
prefix of the language with the state each one leads to. That table is exported once into
padded arrays, so the sampler's jitted loop masks logits with one gather and one scatter per
step and never returns to the host:

    tokens [S, W] int32   allowed token ids of state s, padded with -1
    next   [S, W] int32   the state each allowed token leads to
    final  [S]    bool    the text so far is a complete match (stop tokens are allowed there)

W is the widest state's number of allowed tokens (small for JSON of a fixed schema; a free
string state allows most of the vocabulary, so W grows with it). Rows start in `initial`.
Optionally (`think_then`) some states are free, with no table row to hold the vocabulary:

    free      [S] bool    every token but the stop ids is allowed
    free_next [S] int32   the state a free state moves to on a token outside its table row

`think_then(answer, ...)` puts a thinking prefix before an answer automaton: `<think>`, then up
to a budget of free tokens (the reasoning), then `</think>` (forced at the budget), then the
answer's states: the constraint holds for the answer only.

    constraint = Constraint.from_json_schema(schema, tokenizer)
    out = sampler.generate(ids, mask, max_new_tokens=256, constraint=constraint)
"""

from __future__ import annotations

import functools
import json

import chex
import jax.numpy as jnp
import numpy as np

from t2t_jax.automaton import index_tables


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {v: k for k, v in bytes_to_unicode().items()}


def token_bytes(tokenizer) -> dict[bytes, list[int]]:
    """The raw bytes of every non-special token (byte-level BPE and SentencePiece styles)."""
    decoder, special = _byte_decoder(), set(tokenizer.all_special_ids)
    out: dict[bytes, list[int]] = {}
    for token, i in tokenizer.get_vocab().items():
        if i in special or token in tokenizer.get_added_vocab():
            continue
        if all(c in decoder for c in token):
            raw = bytes(decoder[c] for c in token)
        elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
            raw = bytes([int(token[3:5], 16)])
        else:
            raw = token.replace("\u2581", " ").encode()
        out.setdefault(raw, []).append(i)
    return out


@chex.dataclass(frozen=True)
class Constraint:
    """A token automaton on the device (see the module docstring)."""

    tokens: chex.Array
    next: chex.Array
    final: chex.Array
    initial: chex.Array
    free: chex.Array | None = None  # [S] bool (None: no free state)
    free_next: chex.Array | None = None  # [S] int32

    @classmethod
    def from_regex(cls, regex: str, tokenizer, eos_id: int | None = None) -> Constraint:
        """Compile `regex` over `tokenizer`'s vocabulary with outlines-core."""
        from outlines_core import Index, Vocabulary

        eos = tokenizer.eos_token_id if eos_id is None else eos_id
        tokens, nxt, final, initial = index_tables(Index(regex, Vocabulary(eos, token_bytes(tokenizer))), eos)
        return cls(
            tokens=jnp.asarray(tokens), next=jnp.asarray(nxt), final=jnp.asarray(final), initial=jnp.int32(initial)
        )

    @classmethod
    def from_json_schema(
        cls, schema: dict | str, tokenizer, eos_id: int | None = None, whitespace: str = ""
    ) -> Constraint:
        """JSON text that validates against `schema` (outlines-core's regex of it); `whitespace`
        is the regex allowed between tokens of the JSON (default none: compact JSON)."""
        from outlines_core.json_schema import build_regex_from_schema

        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls.from_regex(build_regex_from_schema(text, whitespace_pattern=whitespace), tokenizer, eos_id)

    @property
    def num_states(self) -> int:
        return int(self.tokens.shape[0])


def think_then(answer: Constraint, think_id: int, end_think_id: int, budget: int, opened: bool = False) -> Constraint:
    """`answer` after a think block: state 0 allows only `think_id` (skipped when the prompt
    `opened` the block), states 1..budget are free (the reasoning; `end_think_id` leaves for the
    answer's initial state), state budget + 1 allows only `end_think_id`; the answer's states
    follow, renumbered by budget + 2. A row reaches the answer within budget + 2 tokens."""
    k = budget + 2
    tokens, nxt = np.asarray(answer.tokens), np.asarray(answer.next)
    width = tokens.shape[1]
    head = np.full((k, width), -1, np.int32)
    head_next = np.zeros((k, width), np.int32)
    head[:, 0] = end_think_id
    head_next[:, 0] = int(answer.initial) + k
    head[0, 0], head_next[0, 0] = think_id, 1
    free = np.zeros(k + tokens.shape[0], bool)
    free[1 : budget + 1] = True
    free_next = np.zeros(k + tokens.shape[0], np.int32)
    free_next[1 : budget + 1] = np.arange(2, budget + 2)
    return Constraint(
        tokens=jnp.asarray(np.concatenate([head, tokens])),
        next=jnp.asarray(np.concatenate([head_next, np.where(tokens >= 0, nxt + k, 0)])),
        final=jnp.asarray(np.concatenate([np.zeros(k, bool), np.asarray(answer.final)])),
        initial=jnp.int32(1 if opened else 0),
        free=jnp.asarray(free),
        free_next=jnp.asarray(free_next),
    )


def allowed_mask(constraint: Constraint, state, vocab: int, stop_ids):
    """state [R] -> [R, V] bool: the tokens state allows, plus the stop ids in final states
    (in a free state every token but the stop ids)."""
    rows = state.shape[0]
    toks = constraint.tokens[state]  # [R, W]
    mask = jnp.zeros((rows, vocab + 1), bool)
    mask = mask.at[jnp.arange(rows)[:, None], jnp.where(toks >= 0, toks, vocab)].set(True)[:, :vocab]
    stops = jnp.zeros((vocab,), bool).at[stop_ids].set(True)
    if constraint.free is not None:
        mask = mask | (constraint.free[state][:, None] & ~stops[None])
    return mask | (constraint.final[state][:, None] & stops[None])


def advance(constraint: Constraint, state, token):
    """The state after `token` [R] (unchanged for a stop token or a token the state lacks; a
    free state's `free_next` for a token outside its row)."""
    toks = constraint.tokens[state]
    hit = toks == token[:, None]
    other = state if constraint.free is None else jnp.where(constraint.free[state], constraint.free_next[state], state)
    return jnp.where(hit.any(-1), jnp.sum(jnp.where(hit, constraint.next[state], 0), axis=-1), other)
