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
2. decode: one jitted chunk of `chunk` steps over the slots in use (free and finished slots
   masked), ending early once every slot is done;
3. retire: finished rows' tokens are read out and their slots freed; repeat until the queue
   and the slots are empty.

Three modules: this one is the glue; scheduler.py holds the host state (queue, slots, budgets,
sizes) and pages.py the cache's row map (a paged cache's page table); slots.py the device state
and the pure functions jitted here. The cache layout, dense (slots x L per layer) or paged
(t2t_jax/models/paged.py, the TPU path: a pool of pages the slots share, memory following the
tokens held), is a protocol (models/base.py `SlotCache`) that neither the device functions nor
the model's layers look behind.

Row r draws its step t with `fold_in(fold_in(key, t), r)` (`sampler.row_keys`, the Sampler's
stream), so a request's output does not depend on which slot or which neighbours it had: the
same tokens as the Sampler's for the same seed (greedy and sampled, up to float reassociation
of the longer masked cache). Budgets are per row. Each call allocates the cache it needs,
`scheduler.slot_tokens(prompt + largest budget)` tokens per slot (16 sizes per octave), and gives
it back when it returns: a long call does not slow or enlarge later small ones. Shapes are fixed
by the slot count, the chunk length and that size, so repeated calls of a size do not recompile
(`compilations`); prefill batches and the decode's attention window (the cache up to the furthest
live row, so a step's attention follows the live tokens, not the cache length) are rounded up to
powers of two: a handful of shapes.

With a paged pool smaller than slots x L (`pages`), rows are admitted while their prompt and first
chunk fit, grow a chunk at a time (the lowest row first), and when the pool runs out the youngest
row gives its pages back and queues again: made again later, it comes out the same (its random
stream is keyed by row and step).

Multi-host: every process runs the same calls; what the host reads back (done flags, step
counts, finished rows) is gathered from every process where it spans them (`to_host`).

Shapes: S slots, L cache tokens per slot, W output width (the largest budget), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from t2t_jax.models.attention import platform_of
from t2t_jax.models.paged import pool_shards
from t2t_jax.sampling import slots as slots_lib
from t2t_jax.sampling.constrained import Constraint
from t2t_jax.sampling.pages import DenseRows, PageTable
from t2t_jax.sampling.sampler import SampleOutput, Sampler
from t2t_jax.sampling.scheduler import Scheduler, bucket, next_pow2, pool_pages, slot_tokens

ENGINES = ("continuous", "static")
KV_LAYOUTS = ("dense", "paged")
KV_CHOICES = ("auto",) + KV_LAYOUTS


def to_host(x) -> np.ndarray:
    """An array -> a numpy copy; a jax.Array that spans processes (multi-host) is gathered from
    all of them (`multihost_utils.process_allgather`: every process calls it at the same point)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.array(multihost_utils.process_allgather(x, tiled=True))
    return np.array(x)


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

    `length`, `width`: the cache tokens per slot and the output width of the last call whose
    cache was allocated (a call whose allocation fails leaves them as they were).
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
        self.shards = pool_shards(getattr(model, "mesh", None), self.slots) if kv == "paged" else 1
        self.stop_ids = jnp.asarray(list(stop_ids), jnp.int32)
        self.pad_id = int(pad_id)
        self.graphdef = nnx.graphdef(model)
        self.length = self.width = 0
        self._empty = jax.jit(
            slots_lib.empty, static_argnums=(0,), static_argnames=("slots", "length", "width", "page_size", "pages")
        )
        self._prefill = jax.jit(slots_lib.prefill, static_argnums=(0,))
        self._admit = jax.jit(slots_lib.admit, donate_argnums=(0,))
        self._layers = jax.jit(slots_lib.layers, static_argnums=(0,))
        self._decode = jax.jit(
            slots_lib.decode, static_argnums=(0,), static_argnames=("chunk", "window"), donate_argnums=(3,)
        )
        self._retire = jax.jit(slots_lib.retire)
        self.stats = {}

    def compilations(self) -> int:
        """Compiled variants of the engine's functions so far (constant after warm-up)."""
        jits = (self._empty, self._prefill, self._admit, self._layers, self._decode, self._retire)
        return sum(f._cache_size() for f in jits)

    def slot_tokens(self, tokens: int) -> int:
        """Cache tokens per slot for a call whose rows need up to `tokens` (`scheduler.slot_tokens`)."""
        return slot_tokens(tokens, self.page_size if self.kv == "paged" else 1)

    def pool_pages(self, length: int | None = None) -> int:
        """Pages in the pool (paged) for slots of `length` tokens (`slot_tokens`' allocation;
        None: the last call's)."""
        length = self.length if length is None else length
        return pool_pages(self.slots, length, self.page_size, self.shards, self.pages)

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
        ids, mask = to_host(input_ids).astype(np.int32), to_host(attention_mask).astype(bool)
        b, p = ids.shape
        total = b * n
        budgets = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (total,)).astype(np.int32)
        width = int(budgets.max(initial=0))
        length = self.slot_tokens(p + width)
        rows = self._rows(length)
        sched = Scheduler(rows, self.chunk, rows.prompt_tokens(mask.sum(axis=1), p), budgets, n, length)
        state = nnx.state(self.model) if params is None else params
        s = self._allocate(state, rows, length, bucket(width))
        sampling = (jax.random.key(seed), jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p))
        fsm0 = jnp.int32(0 if constraint is None else constraint.initial)

        out_tokens = np.full((total, width), self.pad_id, np.int32)
        out_logprobs = np.zeros((total, width), np.float32)
        lengths, stopped = np.zeros(total, np.int32), np.zeros(total, bool)
        layers = self._layers(self.graphdef, state)
        prefilled = {}  # prompt -> (prefill output, its row there), while samples wait
        calls = useful = 0
        self.stats = {"decode_calls": 0}  # (the call's so far: a call stopped by `check` keeps its count)
        while sched.busy():
            if check is not None:
                check()
            left = sched.grow()
            if left:
                s = s.replace(done=s.done.at[jnp.asarray(left)].set(True))
            admitted, dst = sched.admit()
            s = s.replace(cache=s.cache.with_table(rows.table))
            if admitted:
                s = self._admit_rows(s, state, ids, mask, admitted, dst, n, budgets, prefilled, fsm0)
                for q in {r // n for r in admitted} - sched.waiting():  # (a prompt's prefill goes once no sample waits)
                    prefilled.pop(q, None)
            idx, window = sched.plan()
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
            done, step, made = (to_host(x) for x in (s.done, s.step, made))
            calls, useful = calls + 1, useful + int(made)
            self.stats["decode_calls"] = calls
            finished = sched.advance(step, done)
            if len(finished):
                which = np.full(self.slots, self.slots, np.int32)
                which[: len(finished)] = finished
                tok, lp, made, stop = (to_host(x)[: len(finished)] for x in self._retire(s, jnp.asarray(which)))
                done_rows = sched.release(finished)
                out_tokens[done_rows] = tok[:, :width]
                out_logprobs[done_rows] = lp[:, :width]
                lengths[done_rows], stopped[done_rows] = made, stop
        self.stats = {  # (the last call's, complete)
            "decode_calls": calls,
            "useful_tokens": useful - sched.recomputed,
            "preempted": sched.preempted,
            "recomputed_tokens": sched.recomputed,
            "slot_tokens": length,
            "pool_pages": rows.pages,
        }
        return SampleOutput(tokens=out_tokens, logprobs=out_logprobs, lengths=lengths, truncated=~stopped)

    def _rows(self, length: int):
        """The cache's row map for a call of `length` tokens per slot (pages.py)."""
        if self.kv == "dense":
            return DenseRows(self.slots, length)
        return PageTable(self.slots, self.pool_pages(length), self.page_size, length // self.page_size, self.shards)

    def _allocate(self, state, rows, length: int, width: int) -> slots_lib.Slots:
        """Free slots over a new cache; `length` / `width` kept only once it is allocated (an
        allocation that fails, e.g. out of memory, raises and leaves them as they were)."""
        s = self._empty(
            self.graphdef,
            state,
            self.pad_id,
            slots=self.slots,
            length=length,
            width=width,
            page_size=self.page_size if self.kv == "paged" else 0,
            pages=rows.pages,
        )
        jax.block_until_ready(s)  # (an allocation failure surfaces here, not at a later step)
        self.length, self.width = length, width
        return s

    def _admit_rows(self, s, state, ids, mask, admitted, dst, n, budgets, prefilled, fsm0):
        """Prefill the prompts of rows `admitted` not yet prefilled (one call, the batch rounded
        up to a power of two), then copy each row's prompt into its slot `dst` (one call per
        prefill)."""
        prompts = sorted({r // n for r in admitted} - set(prefilled))
        if prompts:
            g = next_pow2(len(prompts))
            rows = prompts + [prompts[0]] * (g - len(prompts))
            pre = self._prefill(self.graphdef, state, jnp.asarray(ids[rows]), jnp.asarray(mask[rows]))
            prefilled.update({q: (pre, i) for i, q in enumerate(prompts)})
        slot_of = dict(zip(admitted, dst))
        for pre in {id(prefilled[r // n][0]): prefilled[r // n][0] for r in admitted}.values():
            mine = [r for r in admitted if prefilled[r // n][0] is pre]
            to = np.full(self.slots, self.slots, np.int32)
            src, rows, budget = (np.zeros(self.slots, np.int32) for _ in range(3))
            to[: len(mine)] = [slot_of[r] for r in mine]
            src[: len(mine)] = [prefilled[r // n][1] for r in mine]
            rows[: len(mine)] = mine
            budget[: len(mine)] = budgets[mine]
            s = self._admit(s, *pre, to, src, rows, budget, fsm0, jnp.int32(self.pad_id))
        return s


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
