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

    constraint = Constraint.from_json_schema(schema, tokenizer)
    out = sampler.generate(ids, mask, max_new_tokens=256, constraint=constraint)
"""

from __future__ import annotations

import functools
import json

import chex
import jax.numpy as jnp

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


def allowed_mask(constraint: Constraint, state, vocab: int, stop_ids):
    """state [R] -> [R, V] bool: the tokens state allows, plus the stop ids in final states."""
    rows = state.shape[0]
    toks = constraint.tokens[state]  # [R, W]
    mask = jnp.zeros((rows, vocab + 1), bool)
    mask = mask.at[jnp.arange(rows)[:, None], jnp.where(toks >= 0, toks, vocab)].set(True)[:, :vocab]
    stops = jnp.zeros((vocab,), bool).at[stop_ids].set(True)
    return mask | (constraint.final[state][:, None] & stops[None])


def advance(constraint: Constraint, state, token):
    """The state after `token` [R] (unchanged for a stop token or a token the state lacks)."""
    toks = constraint.tokens[state]
    hit = toks == token[:, None]
    return jnp.where(hit.any(-1), jnp.sum(jnp.where(hit, constraint.next[state], 0), axis=-1), state)
