"""The engine's device side: its decode slots (`Slots`) and the pure functions the engine jits
over them. The cache is any `models.base.SlotCache` layout (dense or paged): these functions go
through its protocol (admit, take, put) and never ask which it is.

Shapes: S slots, R slots a chunk decodes, G prompts prefilled, P prompt length, W output width
(the largest budget), V vocabulary.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from t2t_jax.sampling import constrained
from t2t_jax.sampling.sampler import row_keys, sample_step


@chex.dataclass
class Slots:
    """The decode slots' state on device: cache (a `SlotCache`, one row per slot); last: [S, V]
    logits of the next token; step, budget, row: [S] int32 (tokens made, allowed, the request
    row: -1 when free); done, stopped: [S] bool (free or finished; a stop token made); fsm: [S]
    int32 constraint states; tokens, logprobs: [S, W] what each slot made."""

    cache: object
    last: chex.Array
    step: chex.Array
    budget: chex.Array
    row: chex.Array
    done: chex.Array
    stopped: chex.Array
    fsm: chex.Array
    tokens: chex.Array
    logprobs: chex.Array

    def take(self, idx, window: int) -> Slots:
        """Slots idx [R], their caches cut to the first `window` columns."""
        sub = jax.tree.map(lambda x: x[idx], self.replace(cache=None))
        return sub.replace(cache=self.cache.take(idx, window))

    def put(self, sub: Slots, idx, window: int) -> Slots:
        """`take`'s inverse: `sub` written back into slots idx."""
        out = jax.tree.map(lambda f, x: f.at[idx].set(x), self.replace(cache=None), sub.replace(cache=None))
        return out.replace(cache=self.cache.put(sub.cache, idx, window))


def empty(graphdef, state, pad_id, *, slots, length, width, page_size=0, pages=0) -> Slots:
    """Free slots over a dense cache of `length` tokens each, or (page_size > 0) a paged one of
    `pages` pages, up to `length` tokens per slot."""
    model = nnx.merge(graphdef, state)
    if page_size:
        cache = model.init_paged_cache(slots, pages, page_size, length // page_size)
    else:
        cache = model.init_cache(slots, length).replace(index=jnp.zeros((slots,), jnp.int32))  # (one index per slot)
    return Slots(
        cache=cache,
        last=jnp.zeros((slots, model.config.vocab_size), jnp.float32),
        step=jnp.zeros((slots,), jnp.int32),
        budget=jnp.zeros((slots,), jnp.int32),
        row=jnp.full((slots,), -1, jnp.int32),
        done=jnp.ones((slots,), bool),
        stopped=jnp.zeros((slots,), bool),
        fsm=jnp.zeros((slots,), jnp.int32),
        tokens=jnp.full((slots, width), pad_id, jnp.int32),
        logprobs=jnp.zeros((slots, width), jnp.float32),
    )


def prefill(graphdef, state, input_ids, attention_mask):
    """[G, P] prompts -> (their dense cache of P slots, last-position logits [G, V])."""
    model = nnx.merge(graphdef, state)
    g, p = input_ids.shape
    hidden, cache = model.hidden(input_ids, attention_mask, cache=model.init_cache(g, p), prefill=True)
    return cache, model.logits_from_hidden(hidden[:, -1])


def admit(slots: Slots, pre, pre_last, dst, src, rows, budgets, fsm0, pad_id) -> Slots:
    """Rows into slots: dst [S] target slots (S: no-op), src [S] their prompt's row in the
    prefill `pre` (P slots) and its logits `pre_last` [G, V], rows / budgets [S] the requests
    (a paged cache: the new rows' pages already in its table)."""
    return slots.replace(
        cache=slots.cache.admit(pre, src, dst),
        last=slots.last.at[dst].set(pre_last[src], mode="drop"),
        step=slots.step.at[dst].set(0, mode="drop"),
        budget=slots.budget.at[dst].set(budgets, mode="drop"),
        row=slots.row.at[dst].set(rows, mode="drop"),
        done=slots.done.at[dst].set(budgets <= 0, mode="drop"),
        stopped=slots.stopped.at[dst].set(False, mode="drop"),
        fsm=slots.fsm.at[dst].set(fsm0, mode="drop"),
        tokens=slots.tokens.at[dst].set(pad_id, mode="drop"),
        logprobs=slots.logprobs.at[dst].set(0.0, mode="drop"),
    )


def layers(graphdef, state):
    return nnx.merge(graphdef, state).unstack_layers()  # once per generation (see Qwen3.hidden)


def decode(graphdef, state, layers, slots: Slots, idx, sampling, stop_ids, pad_id, constraint, *, chunk, window):
    """Up to `chunk` decode steps of slots `idx` [R] (every slot in use among them; the rest
    free), ending early when all are done -> (slots, tokens made). Only those R rows compute, and
    attention reads the first `window` cache columns (every live row's next `chunk` writes fall
    inside them): the step's cost follows the live rows and tokens, not the slots x cache. With
    every slot and the whole cache the slots run in place; otherwise the chunk works on those
    rows' windows (`Slots.take`: a dense cache's a copy, a paged one's pools in place and table
    entries gathered), written back at its end."""
    model = nnx.merge(graphdef, state)
    key, temperature, top_k, top_p = sampling
    whole = idx.shape[0] == slots.step.shape[0] and window == slots.cache.columns()
    s0 = slots if whole else slots.take(idx, window)  # (idx is then every slot, in order)
    rows, width = s0.tokens.shape
    ids = jnp.arange(rows)

    def cond(carry):
        return (carry[0] < chunk) & ~jnp.all(carry[1].done)

    def body(carry):
        i, s, useful = carry
        last = s.last
        if constraint is not None:
            last = jnp.where(constrained.allowed_mask(constraint, s.fsm, last.shape[-1], stop_ids), last, -jnp.inf)
        tok, lp = sample_step(row_keys(key, s.step, s.row), last, temperature, top_k, top_p)
        active = ~s.done
        tok = jnp.where(active, tok, pad_id)
        at = jnp.where(active, s.step, width)  # (out of range: dropped)
        stop = active & jnp.isin(tok, stop_ids)
        step = s.step + active.astype(jnp.int32)
        fsm = constrained.advance(constraint, s.fsm, tok) if constraint is not None else s.fsm
        logits, cache = model(tok[:, None], active[:, None], cache=s.cache, layers=layers)
        s = s.replace(
            cache=cache,
            last=logits[:, -1],
            step=step,
            done=s.done | stop | (step >= s.budget),
            stopped=s.stopped | stop,
            fsm=jnp.where(active, fsm, s.fsm),
            tokens=s.tokens.at[ids, at].set(tok, mode="drop"),
            logprobs=s.logprobs.at[ids, at].set(jnp.where(active, lp, 0.0), mode="drop"),
        )
        return i + 1, s, useful + active.sum()

    _, sub, useful = jax.lax.while_loop(cond, body, (jnp.int32(0), s0, jnp.int32(0)))
    return (sub if whole else slots.put(sub, idx, window)), useful


def retire(slots: Slots, which):
    """The rows of slots `which` [S] (padded with S: zeros) -> (tokens, logprobs, step, stopped)."""
    take = lambda x: x.at[which].get(mode="fill", fill_value=0)  # noqa: E731
    return take(slots.tokens), take(slots.logprobs), take(slots.step), take(slots.stopped)
