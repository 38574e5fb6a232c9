"""`Engine`: continuous batching over a fixed number of decode slots, with the `Sampler`'s
interface (a drop-in for it in `Policy`).

    engine = Engine(model, stop_ids=[eos], pad_id=pad, slots=64, chunk=32)
    out = engine.generate(input_ids, attention_mask, max_new_tokens=256,  # or [B * n] per row
                          temperature=1.0, top_p=0.95, n=8, seed=0)
    out.tokens, out.logprobs, out.lengths, out.truncated   # as Sampler.generate's, row i * n + j

A static batch decodes until its longest row stops, its finished rows computing on. Here the
rows (prompt i, sample j) queue up and take decode slots as they free:

1. admit: queued rows take the free slots; their prompts not prefilled yet are prefilled in one
   call (the n samples of a prompt share it; a prompt's prefill is kept until its last sample
   has a slot), and each row's slot gets a copy of its prompt's cache and last logits;
2. decode: one jitted chunk of `chunk` steps over all slots (free and finished slots masked),
   ending early once every slot is done;
3. retire: finished rows' tokens are read out and their slots freed; repeat until the queue
   and the slots are empty.

Row r draws its step t with `fold_in(fold_in(key, t), r)` (`sampler.row_keys`, the Sampler's
stream), so a request's output does not depend on which slot or which neighbours it had: the
same tokens as the Sampler's for the same seed (greedy and sampled, up to float reassociation
of the longer masked cache). Budgets are per row. Shapes are fixed by the slot count, the chunk
length and the cache length (prompt + budget, grown to the next power of two when a call needs
more), so repeated calls do not recompile (`compilations`); prefill batches and the decode's
attention window (the cache slots up to the furthest live row, so a step's attention follows
the live tokens, not the cache length) are rounded up to powers of two: a handful of shapes.

The cache (`kv`) is dense, slots x L per layer, or paged (t2t_jax/models/paged.py, the TPU
path): a pool of pages the slots share, each slot's page table kept on the host
(`sampling/pages.py`), so memory follows the tokens held. With a pool smaller than slots x L,
rows are admitted while their prompt and first chunk fit, grow a chunk at a time (the lowest row
first), and when the pool runs out the youngest row gives its pages back and queues again: made
again later, it comes out the same (its random stream is keyed by row and step).

Shapes: S slots, L cache length per slot, W output width (the largest budget), V vocabulary.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t2t_jax.models import paged as paged_lib
from t2t_jax.models.attention import platform_of
from t2t_jax.models.paged import PagedKV
from t2t_jax.sampling import constrained
from t2t_jax.sampling.constrained import Constraint
from t2t_jax.sampling.pages import PageTable, pages_for
from t2t_jax.sampling.sampler import SampleOutput, Sampler, row_keys, sample_step


@chex.dataclass
class Slots:
    """The decode slots' state on device: cache (a model cache with index [S]); last: [S, V]
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


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _empty(graphdef, state, pad_id, *, slots, length, width, page_size=0, pages=0):
    """Free slots over a dense cache of `length` slots each, or (page_size > 0) a paged one of
    `pages` pages, up to `length` tokens per slot."""
    model = nnx.merge(graphdef, state)
    if page_size:
        cache = model.init_paged_cache(slots, pages, page_size, int(pages_for(length, page_size)))
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


def _prefill(graphdef, state, input_ids, attention_mask):
    """[G, P] prompts -> (their cache of P slots, last-position logits [G, V])."""
    model = nnx.merge(graphdef, state)
    g, p = input_ids.shape
    hidden, cache = model.hidden(input_ids, attention_mask, cache=model.init_cache(g, p), prefill=True)
    return cache, model.logits_from_hidden(hidden[:, -1])


def _admit(slots: Slots, pre, pre_last, dst, src, rows, budgets, fsm0, pad_id, table=None) -> Slots:
    """Rows into slots: dst [S] target slots (S: no-op), src [S] their prompt's row in the
    prefill `pre` (P slots), rows / budgets [S] the requests; table [S, N]: a paged cache's page
    table, the new rows' pages among it."""
    p = pre.valid.shape[1]
    c = slots.cache
    if isinstance(c, PagedKV):
        n = pre.next_pos[src]  # (the prompts' real tokens)
        mine = table.at[dst].get(mode="fill", fill_value=0)  # (no-op rows: the null page)
        put = lambda pool, x: paged_lib.fill(pool, x[src], mine, n)  # noqa: E731
        cache = c.replace(
            k=tuple(map(put, c.k, pre.k)),
            v=tuple(map(put, c.v, pre.v)),
            table=table,
            lengths=c.lengths.at[dst].set(n, mode="drop"),
        )
    else:
        put = lambda buf, x: buf.at[dst, :, :p].set(x[src], mode="drop")  # noqa: E731  ([S, K, L, E] <- [G, K, P, E])
        valid = c.valid.at[dst].set(False, mode="drop").at[dst, :p].set(pre.valid[src], mode="drop")
        cache = c.replace(
            k=tuple(put(b, x) for b, x in zip(c.k, pre.k)),
            v=tuple(put(b, x) for b, x in zip(c.v, pre.v)),
            valid=valid,
            next_pos=c.next_pos.at[dst].set(pre.next_pos[src], mode="drop"),
            index=c.index.at[dst].set(p, mode="drop"),
        )
    return slots.replace(
        cache=cache,
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


def _layers(graphdef, state):
    return nnx.merge(graphdef, state).unstack_layers()  # once per generation (see Qwen3.hidden)


def _view(slots: Slots, idx, window: int) -> Slots:
    """Slots `idx` [R] with their caches cut to the first `window` slots (a paged cache: page
    table columns; the pools stay shared)."""
    sub = jax.tree.map(lambda x: x[idx], slots.replace(cache=None))
    c = slots.cache
    if isinstance(c, PagedKV):
        return sub.replace(cache=c.replace(table=c.table[idx, :window], lengths=c.lengths[idx]))
    cut = lambda x: x[idx, :, :window]  # noqa: E731
    return sub.replace(
        cache=c.replace(
            k=tuple(map(cut, c.k)),
            v=tuple(map(cut, c.v)),
            valid=c.valid[idx, :window],
            next_pos=c.next_pos[idx],
            index=c.index[idx],
        )
    )


def _merge(slots: Slots, sub: Slots, idx, window: int) -> Slots:
    """`_view`'s inverse: `sub` written back into slots `idx`."""
    out = jax.tree.map(lambda f, x: f.at[idx].set(x), slots.replace(cache=None), sub.replace(cache=None))
    c, w = slots.cache, sub.cache
    if isinstance(c, PagedKV):
        return out.replace(cache=c.replace(k=w.k, v=w.v, lengths=c.lengths.at[idx].set(w.lengths)))
    put = lambda f, x: f.at[idx, :, :window].set(x)  # noqa: E731
    return out.replace(
        cache=c.replace(
            k=tuple(map(put, c.k, w.k)),
            v=tuple(map(put, c.v, w.v)),
            valid=c.valid.at[idx, :window].set(w.valid),
            next_pos=c.next_pos.at[idx].set(w.next_pos),
            index=c.index.at[idx].set(w.index),
        )
    )


def _decode(graphdef, state, layers, slots: Slots, idx, sampling, stop_ids, pad_id, constraint, *, chunk, window):
    """Up to `chunk` decode steps of slots `idx` [R] (every slot in use among them; the rest
    free), ending early when all are done -> (slots, tokens made). Only those R rows compute, and
    attention reads the first `window` cache slots (a paged cache: page table columns; every live
    row's next `chunk` writes fall inside them): the step's cost follows the live rows and tokens,
    not the slots x cache. With every slot and the whole cache the slots run in place; otherwise
    the chunk works on a gathered copy of those rows' windows (a dense cache: its memory plus that
    copy; a paged one: the pools in place, the rows' table entries gathered), written back at its
    end."""
    model = nnx.merge(graphdef, state)
    key, temperature, top_k, top_p = sampling
    c = slots.cache
    whole = idx.shape[0] == slots.step.shape[0] and window == (
        c.table.shape[1] if isinstance(c, PagedKV) else c.valid.shape[1]
    )
    s0 = slots if whole else _view(slots, idx, window)  # (idx is then every slot, in order)
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
    return (sub if whole else _merge(slots, sub, idx, window)), useful


def _retire(slots: Slots, which):
    """The rows of slots `which` [S] (padded with S: zeros) -> (tokens, logprobs, step, stopped)."""
    take = lambda x: x.at[which].get(mode="fill", fill_value=0)  # noqa: E731
    return take(slots.tokens), take(slots.logprobs), take(slots.step), take(slots.stopped)


class Engine:
    """Continuous batching (see the module docstring).

    Args:
      model: a t2t_jax causal LM (its current weights are captured at each `generate` call).
      stop_ids, pad_id: as the Sampler's.
      slots: decode rows in flight.
      chunk: decode steps per jitted call between admissions.
      kv: "dense" (a cache of slots x length per layer) or "paged" (a pool of pages shared by
        the slots, t2t_jax/models/paged.py: memory follows the tokens held; the TPU layout).
      page_size: tokens per page (paged).
      pages: pages in the pool (paged; 0: enough for every slot at its full length, so no row
        ever waits). With fewer, a row is admitted when its prompt and first chunk fit, rows grow
        a chunk at a time, oldest first, and when the pool runs out the youngest row gives its
        pages back and queues again (recomputed later: the same tokens, its random stream keyed by
        row and step). Under a mesh the pool splits over the batch axes with the slots.
    """

    def __init__(
        self,
        model,
        stop_ids: Sequence[int],
        pad_id: int,
        slots: int = 64,
        chunk: int = 32,
        kv: str = "dense",
        page_size: int = 64,
        pages: int = 0,
    ):
        if slots < 1 or chunk < 1:
            raise ValueError(f"Engine: slots ({slots}) and chunk ({chunk}) must be >= 1")
        if kv not in KV_LAYOUTS:
            raise ValueError(f"rollout.kv: {kv!r} is not one of {KV_LAYOUTS}")
        if kv == "paged" and (page_size < 1 or pages < 0):
            raise ValueError(f"Engine: page_size ({page_size}) must be >= 1 and pages ({pages}) >= 0")
        self.model, self.slots, self.chunk = model, int(slots), int(chunk)
        self.kv, self.page_size, self.pages = kv, int(page_size), int(pages)
        self.shards = paged_lib.pool_shards(getattr(model, "mesh", None), self.slots) if kv == "paged" else 1
        self.stop_ids = jnp.asarray(list(stop_ids), jnp.int32)
        self.pad_id = int(pad_id)
        self.graphdef = nnx.graphdef(model)
        self.length = self.width = 0  # the slots' cache length and output width (grown on demand)
        self._empty = jax.jit(
            _empty, static_argnums=(0,), static_argnames=("slots", "length", "width", "page_size", "pages")
        )
        self._prefill = jax.jit(_prefill, static_argnums=(0,))
        self._admit = jax.jit(_admit, donate_argnums=(0,))
        self._layers = jax.jit(_layers, static_argnums=(0,))
        self._decode = jax.jit(_decode, static_argnums=(0,), static_argnames=("chunk", "window"), donate_argnums=(3,))
        self._retire = jax.jit(_retire)
        self.stats = {}

    def compilations(self) -> int:
        """Compiled variants of the engine's functions so far (constant after warm-up)."""
        jits = (self._empty, self._prefill, self._admit, self._layers, self._decode, self._retire)
        return sum(f._cache_size() for f in jits)

    def pool_pages(self) -> int:
        """Pages in the pool at the current cache length (paged)."""
        per_slot = int(pages_for(self.length, self.page_size))
        return self.pages or self.slots * per_slot + self.shards  # (+ a null page per shard)

    def generate(
        self,
        input_ids,
        attention_mask,
        max_new_tokens,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int = 0,
        constraint: Constraint | None = None,
        params=None,
        check=None,
    ) -> SampleOutput:
        """input_ids, attention_mask: [B, P] left-padded -> SampleOutput with B * n rows, width
        max(max_new_tokens). max_new_tokens: an int, or [B * n] per-row budgets. check: called
        before every decode chunk, may raise to stop early (the stage loop's SIGTERM: the
        exception propagates and the rows in flight are dropped)."""
        ids, mask = np.asarray(input_ids, np.int32), np.asarray(attention_mask, bool)
        b, p = ids.shape
        total = b * n
        budgets = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (total,)).astype(np.int32)
        width = int(budgets.max(initial=0))
        self.length = max(self.length, _next_pow2(p + width))
        self.width = max(self.width, _next_pow2(width))
        state = nnx.state(self.model) if params is None else params
        sampling = (jax.random.key(seed), jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p))
        fsm0 = jnp.int32(0 if constraint is None else constraint.initial)
        paging = None
        if self.kv == "paged":
            per_slot = int(pages_for(self.length, self.page_size))
            paging = PageTable(self.slots, self.pool_pages(), self.page_size, per_slot, self.shards)
            need = mask.sum(axis=1).repeat(n) + budgets  # (tokens a row holds at most)
            if need.max(initial=0) > paging.capacity():
                raise ValueError(
                    f"rollout.pages: a request needs {int(need.max())} tokens of cache, the pool holds at most "
                    f"{paging.capacity()} per slot ({paging.per_shard - 1} pages of {self.page_size} per shard)"
                )
        s = self._empty(
            self.graphdef,
            state,
            self.pad_id,
            slots=self.slots,
            length=self.length,
            width=self.width,
            page_size=self.page_size if paging else 0,
            pages=paging.per_shard * self.shards if paging else 0,
        )

        out_tokens = np.full((total, width), self.pad_id, np.int32)
        out_logprobs = np.zeros((total, width), np.float32)
        lengths, stopped = np.zeros(total, np.int32), np.zeros(total, bool)
        queue = deque(range(total))
        occupant = np.full(self.slots, -1)  # the row in each slot (host side)
        step = np.zeros(self.slots, np.int64)  # tokens made in each slot (host side)
        held = np.zeros(self.slots, np.int64)  # tokens a slot's cache holds (paged: its prompt + step)
        real = mask.sum(axis=1)  # each prompt's real tokens
        layers = self._layers(self.graphdef, state)
        prefilled = {}  # prompt -> (prefill output, its row there), while samples wait
        calls = useful = preempted = recomputed = 0
        while queue or (occupant >= 0).any():
            if check is not None:
                check()
            free = np.flatnonzero(occupant < 0)
            if paging is None:
                admit = [queue.popleft() for _ in range(min(len(free), len(queue)))]
            else:
                s, requeued, lost = self._grow(s, paging, occupant, held, budgets, real, n)
                queue.extendleft(reversed(requeued))
                preempted, recomputed = preempted + len(requeued), recomputed + lost
                free = np.flatnonzero(occupant < 0)
                admit = self._fit(paging, queue, free, real, budgets, n)
            if admit:
                s = self._admit_rows(s, state, ids, mask, admit, free, n, budgets, prefilled, fsm0, paging)
                occupant[free[: len(admit)]] = admit
                step[free[: len(admit)]] = 0
                held[free[: len(admit)]] = real[np.asarray(admit) // n]
                waiting = {r // n for r in queue}
                for q in {r // n for r in admit} - waiting:  # (a prompt's prefill goes once no sample of it waits)
                    prefilled.pop(q, None)
            live = (0 if paging else p) + int((held if paging else step)[occupant >= 0].max()) + self.chunk
            window = min(self.length, max(64, _next_pow2(live)))  # (the cache slots any row reads or writes)
            if paging is not None:
                window = min(paging.table.shape[1], int(pages_for(window, self.page_size)))
                s = s.replace(cache=s.cache.replace(table=jnp.asarray(paging.table)))
            used = np.flatnonzero(occupant >= 0)  # the rows in flight, padded with free slots
            rows = min(self.slots, _next_pow2(len(used)))
            if self.shards > 1:
                rows = self.slots  # (the slots stay on their shards, with their pools)
            idx = (
                np.arange(self.slots)
                if rows == self.slots
                else np.concatenate([used, np.flatnonzero(occupant < 0)])[:rows]
            )
            s, made = self._decode(
                self.graphdef,
                state,
                layers,
                s,
                jnp.asarray(idx, jnp.int32),
                sampling,
                self.stop_ids,
                jnp.int32(self.pad_id),
                constraint,
                chunk=self.chunk,
                window=window,
            )
            done, new_step = np.asarray(s.done), np.array(s.step)
            held += np.where(occupant >= 0, new_step - step, 0)
            step = new_step
            calls, useful = calls + 1, useful + int(made)
            finished = np.flatnonzero(done & (occupant >= 0))
            if len(finished):
                which = np.full(self.slots, self.slots, np.int32)
                which[: len(finished)] = finished
                tok, lp, made, stop = (np.asarray(x)[: len(finished)] for x in self._retire(s, jnp.asarray(which)))
                rows = occupant[finished]
                out_tokens[rows] = tok[:, :width]
                out_logprobs[rows] = lp[:, :width]
                lengths[rows], stopped[rows] = made, stop
                occupant[finished] = -1
                if paging is not None:
                    for slot in finished:
                        paging.release(slot)
        self.stats = {"decode_calls": calls, "useful_tokens": useful - recomputed}  # (the last call's)
        if paging is not None:
            self.stats.update(
                preempted=preempted, recomputed_tokens=recomputed, pool_pages=paging.per_shard * self.shards
            )
        return SampleOutput(tokens=out_tokens, logprobs=out_logprobs, lengths=lengths, truncated=~stopped)

    def _grow(self, s, paging, occupant, held, budgets, real, n):
        """Pages for every live row's next chunk, oldest row first; when the pool runs out, the
        youngest rows give theirs back -> (slots, the rows to queue again, oldest first, the
        tokens they had made: to be made again)."""
        order = sorted(np.flatnonzero(occupant >= 0), key=lambda slot: occupant[slot])  # (the lowest row first)
        requeued, lost = [], 0
        for slot in order:
            if occupant[slot] < 0:
                continue
            row = occupant[slot]
            want = min(held[slot] + self.chunk, real[row // n] + budgets[row])
            while not paging.grow(slot, want):
                mates = [x for x in order if occupant[x] >= 0 and paging.shard(x) == paging.shard(slot)]
                young = max(mates, key=lambda x: occupant[x])  # (this slot itself when it is the youngest)
                paging.release(young)
                requeued.append(int(occupant[young]))
                lost += int(held[young] - real[occupant[young] // n])
                s = s.replace(done=s.done.at[young].set(True))
                occupant[young] = -1
                if young == slot:
                    break
        return s, sorted(requeued), lost

    def _fit(self, paging, queue, free, real, budgets, n):
        """The queued rows that free slots take while their prompt and first chunk fit the pool
        (pages taken here); the first that does not fit waits, and those behind it."""
        admit = []
        for slot in free:
            if not queue:
                break
            row = queue[0]
            if not paging.grow(slot, min(real[row // n] + self.chunk, real[row // n] + budgets[row])):
                break
            admit.append(queue.popleft())
        return admit

    def _admit_rows(self, s, state, ids, mask, admit, free, n, budgets, prefilled, fsm0, paging=None):
        """Prefill the prompts of rows `admit` not yet prefilled (one call, the batch rounded up
        to a power of two), then copy each row's prompt into its slot (one call per prefill)."""
        prompts = sorted({r // n for r in admit} - set(prefilled))
        if prompts:
            g = _next_pow2(len(prompts))
            rows = prompts + [prompts[0]] * (g - len(prompts))
            pre = self._prefill(self.graphdef, state, jnp.asarray(ids[rows]), jnp.asarray(mask[rows]))
            prefilled.update({q: (pre, i) for i, q in enumerate(prompts)})
        slots_of = dict(zip(admit, free[: len(admit)]))
        table = None if paging is None else jnp.asarray(paging.table)
        for pre in {id(prefilled[r // n][0]): prefilled[r // n][0] for r in admit}.values():
            mine = [r for r in admit if prefilled[r // n][0] is pre]
            dst = np.full(self.slots, self.slots, np.int32)
            src, rows, budget = (np.zeros(self.slots, np.int32) for _ in range(3))
            dst[: len(mine)] = [slots_of[r] for r in mine]
            src[: len(mine)] = [prefilled[r // n][1] for r in mine]
            rows[: len(mine)] = mine
            budget[: len(mine)] = budgets[mine]
            s = self._admit(s, *pre, dst, src, rows, budget, fsm0, jnp.int32(self.pad_id), table)
        return s


ENGINES = ("continuous", "static")
KV_LAYOUTS = ("dense", "paged")
KV_CHOICES = ("auto",) + KV_LAYOUTS


def resolve_kv(kv: str, model) -> str:
    """`rollout.kv`: "auto" -> "paged" on TPU (the model's mesh, else JAX's backend), else "dense"."""
    if kv not in KV_CHOICES:
        raise ValueError(f"rollout.kv: {kv!r} is not one of {KV_CHOICES}")
    if kv != "auto":
        return kv
    return "paged" if platform_of(getattr(model, "mesh", None)) == "tpu" else "dense"


def make_sampler(
    model,
    stop_ids: Sequence[int],
    pad_id: int,
    engine: str = "continuous",
    slots: int = 64,
    chunk: int = 32,
    kv: str = "auto",
    page_size: int = 64,
    pages: int = 0,
):
    """`rollout.engine`: "continuous" (this Engine, its cache by `rollout.kv`) or "static" (the
    Sampler: one batch to its longest row); both take `generate(...)` alike and give the same
    outputs."""
    if engine not in ENGINES:
        raise ValueError(f"rollout.engine: {engine!r} is not one of {ENGINES}")
    if engine == "static":
        return Sampler(model, stop_ids, pad_id)
    return Engine(model, stop_ids, pad_id, slots, chunk, resolve_kv(kv, model), page_size, pages)
