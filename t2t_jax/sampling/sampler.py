"""`Sampler`: batched generation with a jitted prefill and a jitted KV-cache decode loop.

    out = Sampler(model, stop_ids=[eos], pad_id=pad).generate(
        input_ids, attention_mask, max_new_tokens=256, temperature=1.0, top_p=0.95, n=8, seed=0)
    out.tokens    # [B * n, max_new_tokens] new tokens only, pad_id after the stop token
    out.logprobs  # [B * n, max_new_tokens] log-prob of each sampled token under the full
                  # softmax at the sampling temperature (top-k / top-p choose the tokens but do
                  # not renormalise these: they are the trainer's log-probs), at temperature 1
                  # for greedy decoding, 0 after the stop
    out.lengths   # [B * n] tokens up to and including the stop token
    out.truncated # [B * n] no stop token within the budget

Prompts are left-padded (t2t_jax.text.prompts pads to bucketed lengths, so a run compiles a
handful of shapes). The `n` samples of a prompt share one prefill: its cache rows are repeated
before decoding, and row i * n + j is sample j of prompt i. The decode loop is a
`lax.while_loop` that stops when every row has stopped or at the budget; the cache lives inside
the compiled call and is updated in place, and the layer weights are unstacked once before the
loop (`Qwen3.unstack_layers`), so no step copies them. Sampling parameters (temperature, top_k,
top_p, the seed) are traced, so changing them does not recompile; the shapes and `n` are static. Row r
draws its step t with `fold_in(fold_in(key, t), r)` (`row_keys`, the stream engine.py follows too). A `constraint`
(constrained.py) masks each step's logits to the tokens its automaton allows.
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from t2t_jax.sampling import constrained
from t2t_jax.sampling.constrained import Constraint


@chex.dataclass(frozen=True)
class SampleOutput:
    tokens: chex.Array
    logprobs: chex.Array
    lengths: chex.Array
    truncated: chex.Array


def filter_logits(logits, top_k, top_p):
    """Mask logits [..., V] outside the top-k (k <= 0: off) and the top-p nucleus (p >= 1: off).
    The most likely token always survives."""
    v = logits.shape[-1]
    sorted_desc = jnp.sort(logits, axis=-1)[..., ::-1]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    kth = jnp.take_along_axis(sorted_desc, jnp.broadcast_to(k - 1, logits.shape[:-1])[..., None], axis=-1)
    logits = jnp.where(logits < kth, -jnp.inf, logits)
    sorted_desc = jnp.where(sorted_desc < kth, -jnp.inf, sorted_desc)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly more likely tokens
    cutoff = jnp.min(jnp.where(before < top_p, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where((top_p < 1.0) & (logits < cutoff), -jnp.inf, logits)


def row_keys(key, steps, rows):
    """The sampling stream: row r at its step t draws with fold_in(fold_in(key, t), r).
    steps, rows: [R] int (or steps a scalar shared by all rows) -> keys [R]."""
    steps = jnp.broadcast_to(steps, rows.shape)
    return jax.vmap(lambda t, r: jax.random.fold_in(jax.random.fold_in(key, t), r))(steps, rows)


def sample_step(keys, logits, temperature, top_k, top_p):
    """logits [R, V] fp32, keys [R] (`row_keys`) -> (tokens [R], logprobs [R]); greedy where
    temperature == 0.

    The log-prob is of the full softmax of logits / temperature, also under top-k / top-p (the
    policy the trainer scores, not the renormalised nucleus the token was drawn from).

    Branches are `lax.cond`s on the (traced) parameters, so greedy decoding never sorts the
    vocabulary and plain temperature sampling sorts it only when top-k / top-p are on."""

    def greedy():
        tokens = jnp.argmax(logits, axis=-1)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]

    def sampled():
        scaled = logits / temperature
        filtered = jax.lax.cond(
            (top_k > 0) | (top_p < 1.0), lambda: filter_logits(scaled, top_k, top_p), lambda: scaled
        )
        tokens = jax.vmap(jax.random.categorical)(keys, filtered)
        logp = jax.nn.log_softmax(scaled, axis=-1)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]

    return jax.lax.cond(temperature <= 0, greedy, sampled)


def _generate(
    graphdef,
    state,
    input_ids,
    attention_mask,
    key,
    temperature,
    top_k,
    top_p,
    stop_ids,
    pad_id,
    constraint,
    *,
    max_new_tokens,
    n,
):
    model = nnx.merge(graphdef, state)
    b, p = input_ids.shape
    cache = model.init_cache(b, p + max_new_tokens)
    hidden, cache = model.hidden(input_ids, attention_mask, cache=cache, prefill=True)  # scanned prefill
    layers = model.unstack_layers()  # once, outside the loop (see Qwen3.hidden)
    last = model.logits_from_hidden(hidden[:, -1])  # the prompt's last position only
    rows = b * n
    cache = cache.map_rows(lambda x: jnp.repeat(x, n, axis=0))
    last = jnp.repeat(last, n, axis=0)

    def cond(carry):
        return (carry[0] < max_new_tokens) & ~jnp.all(carry[4])

    def body(carry):
        t, cache, last, tokens, done, logprobs, lengths, fsm = carry
        if constraint is not None:
            allowed = constrained.allowed_mask(constraint, fsm, last.shape[-1], stop_ids)
            last = jnp.where(allowed, last, -jnp.inf)
        tok, lp = sample_step(row_keys(key, t, jnp.arange(rows)), last, temperature, top_k, top_p)
        tok = jnp.where(done, pad_id, tok)
        lp = jnp.where(done, 0.0, lp)
        tokens = tokens.at[:, t].set(tok)
        logprobs = logprobs.at[:, t].set(lp)
        lengths = lengths + (~done).astype(jnp.int32)
        done = done | jnp.isin(tok, stop_ids)
        if constraint is not None:
            fsm = constrained.advance(constraint, fsm, tok)
        logits, cache = model(tok[:, None], jnp.ones((rows, 1), bool), cache=cache, layers=layers)
        return t + 1, cache, logits[:, -1], tokens, done, logprobs, lengths, fsm

    fsm = jnp.zeros((rows,), jnp.int32) + (0 if constraint is None else constraint.initial)
    init = (
        jnp.int32(0),
        cache,
        last,
        jnp.full((rows, max_new_tokens), pad_id, jnp.int32),
        jnp.zeros((rows,), bool),
        jnp.zeros((rows, max_new_tokens), jnp.float32),
        jnp.zeros((rows,), jnp.int32),
        fsm,
    )
    _, _, _, tokens, done, logprobs, lengths, _ = jax.lax.while_loop(cond, body, init)
    return SampleOutput(tokens=tokens, logprobs=logprobs, lengths=lengths, truncated=~done)


class Sampler:
    """Generation from a Qwen3 model (see the module docstring).

    Args:
      model: a t2t_jax Qwen3 (its current weights are captured at each `generate` call).
      stop_ids: token ids that end a completion (e.g. tokenizer.stop_ids(tok)).
      pad_id: written after the stop token.
    """

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int):
        self.model = model
        self.stop_ids = jnp.asarray(list(stop_ids), jnp.int32)
        self.pad_id = int(pad_id)
        self.graphdef = nnx.graphdef(model)
        self._jit = jax.jit(_generate, static_argnums=(0,), static_argnames=("max_new_tokens", "n"))

    def generate(
        self,
        input_ids,
        attention_mask,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
        constraint: Constraint | None = None,
        params=None,
        check=None,
    ) -> SampleOutput:
        """input_ids, attention_mask: [B, P] left-padded -> SampleOutput with B * n rows.

        constraint: a `Constraint` (constrained.py) every row's text must follow; the stop ids
        are allowed only where the text so far is a complete match. params: weights to sample
        with instead of the model's own (an `nnx.State` of the same model, e.g. the trainer's).
        check: called once before decoding, may raise to stop (one `while_loop` decodes the whole
        batch, so nothing can stop it midway; the Engine calls it between chunks)."""
        if check is not None:
            check()
        state = nnx.state(self.model) if params is None else params
        return self._jit(
            self.graphdef,
            state,
            jnp.asarray(input_ids, jnp.int32),
            jnp.asarray(attention_mask, bool),
            jax.random.key(seed),
            jnp.float32(temperature),
            jnp.int32(top_k),
            jnp.float32(top_p),
            self.stop_ids,
            jnp.int32(self.pad_id),
            constraint,
            max_new_tokens=max_new_tokens,
            n=n,
        )

    def compilations(self) -> int:
        """Compiled variants of the generate function so far (shared by every Sampler in the
        process; a run should keep it constant after warm-up)."""
        return self._jit._cache_size()
