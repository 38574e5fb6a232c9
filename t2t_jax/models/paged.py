"""A paged KV cache for decode slots: a pool of fixed-size pages that the slots share, and a page
table per slot, so the cache's memory follows the tokens held rather than slots x budget (the
layout of vLLM and JetStream, and of JAX's TPU kernel `paged_attention`).

    cache = model.init_paged_cache(slots=S, pages=P, page_size=16, pages_per_slot=N)
    logits, cache = model(tok, active[:, None], cache=cache, layers=layers)   # one decode step

Slot s holds its tokens without padding: token j at page `table[s, j // page_size]`, offset
`j % page_size`, RoPE position j. Page 0 of each shard of the pool is the null page: never
handed out, the target of unused table entries and of the writes of inactive slots. Which pages
a slot owns is the host's business (`t2t_jax.sampling.pages.PageTable`): the device sees the
table.

`PagedKV` is the paged layout of the cache protocol (models/base.py `SlotCache`): the model's
layers write and attend through it without knowing the layout. A decode step writes each active
slot's new key and value at its length (`write_step`), then attends over its first length + 1
tokens (`attend`; both: `decode_attention`), by kernel:
- `paged`: `jax.experimental.pallas.ops.tpu.paged_attention` (the TPU kernel; Pallas interpret
  mode elsewhere, how the tests check it on CPU). It reads K/V in bfloat16.
- `gather`: the slots' pages gathered into [S, K, N * page, E] and the dense kernel (the
  reference; a CPU's choice).
Under a mesh with more than one device the write and the attention run in `shard_map`: slots
and pages over the batch axes (each shard owns its slots and a pool of its own, the table's
page ids local to it), kv heads over the `kv_heads` rule's axis.

Shapes: S slots, K kv heads, H query heads, E head_dim, P pages, N pages per slot.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from t2t_jax.models import attention as attention_lib

KERNELS = ("paged", "gather")


@chex.dataclass
class PagedKV:
    """k, v: tuples of L arrays [K, P, page_size, E] (one pool per layer); table: [S, N] int32
    page ids (0: the null page); lengths: [S] int32 tokens held per slot.

    The paged layout of `models.base.SlotCache`: one token per slot per call (decode steps), slot
    token j at RoPE position j; prompts come in through `admit` (from a dense prefill)."""

    k: chex.Array
    v: chex.Array
    table: chex.Array
    lengths: chex.Array

    def map_rows(self, fn) -> PagedKV:
        """`fn` on the per-slot arrays (table, lengths); the pools are shared."""
        return self.replace(table=fn(self.table), lengths=fn(self.lengths))

    def positions(self, mask):
        """mask [S, 1] (the active slots) -> [S, 1]: each slot's next token sits at its length."""
        if mask.shape[1] != 1:
            raise ValueError(f"a paged cache takes one token per slot per call (decode steps), got {mask.shape[1]}")
        return self.lengths[:, None]

    def write(self, store, k, v, mask, kernels):
        """k, v [S, K, 1, E] into one layer's pools at the active slots' lengths (`write_step`)."""
        return write_step(*store, k, v, self.table, self.lengths, mask[:, 0], kernels.mesh)

    def attend(self, store, q, mask, kernels):
        """q [S, H, 1, E] over each active slot's tokens, its new one included (`attend`)."""
        return attend(q, *store, self.table, self.lengths, mask[:, 0], kernels.paged, kernels.mesh)

    def advance(self, stores, mask) -> PagedKV:
        """The written pools; the active slots (mask [S, 1]) hold one more token."""
        k, v = zip(*stores)
        return self.replace(k=tuple(k), v=tuple(v), lengths=self.lengths + mask[:, 0].astype(jnp.int32))

    def columns(self) -> int:
        """Page table entries per slot (N)."""
        return self.table.shape[1]

    def with_table(self, table) -> PagedKV:
        """The host's page table [S, N] (copied to the device)."""
        return self.replace(table=jnp.array(table, jnp.int32))

    def admit(self, prefill, src, dst) -> PagedKV:
        """Prompts src [S] of a dense prefill (left-padded, its `next_pos` real tokens) into slots
        dst [S] (S: no-op, its writes to the null page), through their pages in the table."""
        n = prefill.next_pos[src]  # (the prompts' real tokens)
        mine = self.table.at[dst].get(mode="fill", fill_value=0)  # (no-op rows: the null page)
        put = lambda pool, x: fill(pool, x[src], mine, n)  # noqa: E731
        return self.replace(
            k=tuple(map(put, self.k, prefill.k)),
            v=tuple(map(put, self.v, prefill.v)),
            lengths=self.lengths.at[dst].set(n, mode="drop"),
        )

    def take(self, idx, window: int) -> PagedKV:
        """Slots idx [R] with their first `window` table entries; the pools stay shared."""
        return self.replace(table=self.table[idx, :window], lengths=self.lengths[idx])

    def put(self, sub: PagedKV, idx, window: int) -> PagedKV:
        """`take`'s inverse: the pools `sub` wrote, its lengths into slots idx (the table is the host's)."""
        return self.replace(k=sub.k, v=sub.v, lengths=self.lengths.at[idx].set(sub.lengths))


def empty(
    layers: int,
    kv_heads: int,
    head_dim: int,
    *,
    slots: int,
    pages: int,
    page_size: int,
    pages_per_slot: int,
    dtype,
    mesh=None,
) -> PagedKV:
    """A pool of `pages` pages per layer (the null pages among them), every table entry null;
    under a mesh the pools placed as `decode_attention` splits them."""

    def zeros():
        pool = jnp.zeros((kv_heads, pages, page_size, head_dim), dtype)
        if mesh is None or mesh.size == 1:
            return pool
        from jax.sharding import NamedSharding

        return jax.lax.with_sharding_constraint(pool, NamedSharding(mesh, _pool_spec(mesh, slots, kv_heads)))

    pool = lambda: tuple(zeros() for _ in range(layers))  # noqa: E731
    return PagedKV(
        k=pool(),
        v=pool(),
        table=jnp.zeros((slots, pages_per_slot), jnp.int32),
        lengths=jnp.zeros((slots,), jnp.int32),
    )


def write(pool, x, table, at):
    """x [S, K, T, E] into pool [K, P, page, E] at token positions at [S, T] of each slot's
    table [S, N] (at < 0: to the null page)."""
    page_size = pool.shape[2]
    page = jnp.take_along_axis(table, jnp.clip(at, 0) // page_size, axis=1, mode="clip")
    page = jnp.where(at >= 0, page, 0)
    return pool.at[:, page, at % page_size].set(x.transpose(1, 0, 2, 3).astype(pool.dtype))


def fill(pool, x, table, lengths):
    """Left-padded prompts' keys or values x [S, K, T, E] (the last `lengths` [S] positions real)
    into pool [K, P, page, E] at tokens 0..length-1 of each slot's table [S, N]."""
    t = x.shape[2]
    at = jnp.arange(t)[None, :] - (t - lengths[:, None])  # (pads: < 0, to the null page)
    return write(pool, x, table, at)


def _gather_attend(q, k_pool, v_pool, table, lengths):
    """q [S, H, 1, E] over each slot's first `lengths` tokens -> [S, 1, H * E]."""
    s, n = table.shape
    _, _, page, e = k_pool.shape
    view = lambda pool: pool[:, table].reshape(pool.shape[0], s, n * page, e).swapaxes(0, 1)  # noqa: E731
    mask = (jnp.arange(n * page) < lengths[:, None])[:, None, :]  # [S, 1, N * page]
    return attention_lib.dense(q, view(k_pool).astype(q.dtype), view(v_pool).astype(q.dtype), mask)


def _kernel_attend(q, k_pool, v_pool, table, lengths, interpret: bool):
    """The Pallas kernel (see the module docstring); q [S, H, 1, E] -> [S, 1, H * E]."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    s, h, _, e = q.shape
    n = table.shape[1]
    block = next(b for b in (8, 4, 2, 1) if n % b == 0)  # pages per compute block (divides N)
    run = functools.partial(paged_attention, pages_per_compute_block=block)
    qs = (q[:, :, 0] * jnp.asarray(e**-0.5, q.dtype)).astype(jnp.float32)
    if interpret:
        with pltpu.force_tpu_interpret_mode():
            out = run(qs, k_pool, v_pool, lengths, table)
    else:
        out = run(qs, k_pool, v_pool, lengths, table)
    return out.astype(q.dtype).reshape(s, 1, h * e)


def _sharded(fn, mesh, slots: int, kv_heads: int, in_specs, out_specs):
    """`fn` as is on one device, else in `shard_map` over `mesh`; in_specs: a name per argument,
    out_specs: per output (or one name): "rows" ([S, ...] over the batch axes), "heads" ([S, H or
    K, ...], heads over the kv-heads axis too), "out" ([S, 1, H * E]) or "pool" (`_pool_spec`)."""
    if mesh is None or mesh.size == 1:
        return fn
    from jax.sharding import PartitionSpec as P

    from t2t_jax import sharding

    rows, kv = sharding.spec(("batch", "kv_heads"), (slots, kv_heads), mesh)  # (q heads follow kv heads)
    specs = {"rows": P(rows), "heads": P(rows, kv), "out": P(rows, None, kv), "pool": _pool_spec(mesh, slots, kv_heads)}
    out = specs[out_specs] if isinstance(out_specs, str) else tuple(specs[n] for n in out_specs)
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(specs[n] for n in in_specs), out_specs=out, check_vma=False)


def write_step(k_pool, v_pool, k, v, table, lengths, active, mesh=None):
    """One decode step's keys and values k, v [S, K, 1, E] into the pools [K, P, page, E] at the
    active [S] slots' lengths [S] through their tables [S, N] (inactive: the null page) -> (k_pool,
    v_pool)."""

    def step(k_pool, v_pool, k, v, table, lengths, active):
        at = jnp.where(active, lengths, -1)[:, None]
        return write(k_pool, k, table, at), write(v_pool, v, table, at)

    specs = ("pool", "pool", "heads", "heads", "rows", "rows", "rows"), ("pool", "pool")
    return _sharded(step, mesh, k.shape[0], k.shape[1], *specs)(k_pool, v_pool, k, v, table, lengths, active)


def attend(q, k_pool, v_pool, table, lengths, active, kernel: str = "gather", mesh=None):
    """q [S, H, 1, E] over each active slot's first lengths + 1 tokens (this step's written),
    by `kernel` -> [S, 1, H * E] (an inactive slot reads one token: its output is garbage)."""
    if kernel not in KERNELS:
        raise ValueError(f"paged attention kernel: {kernel!r} is not one of {KERNELS}")
    interpret = attention_lib.platform_of(mesh) != "tpu"

    def step(q, k_pool, v_pool, table, lengths, active):
        seen = jnp.where(active, lengths + 1, 1)
        if kernel == "paged":
            return _kernel_attend(q, k_pool, v_pool, table, seen, interpret)
        return _gather_attend(q, k_pool, v_pool, table, seen)

    specs = ("heads", "pool", "pool", "rows", "rows", "rows"), "out"
    return _sharded(step, mesh, q.shape[0], k_pool.shape[0], *specs)(q, k_pool, v_pool, table, lengths, active)


def decode_attention(q, k, v, k_pool, v_pool, table, lengths, active, kernel: str = "gather", mesh=None):
    """One decode step of one layer: q [S, H, 1, E]; k, v [S, K, 1, E] this step's keys and
    values; table [S, N]; lengths [S] tokens held before the step; active [S] bool ->
    (out [S, 1, H * E], k_pool, v_pool) with the active slots' k/v written at their lengths."""
    k_pool, v_pool = write_step(k_pool, v_pool, k, v, table, lengths, active, mesh)
    return attend(q, k_pool, v_pool, table, lengths, active, kernel, mesh), k_pool, v_pool


def _pool_spec(mesh, slots: int, kv_heads: int):
    """The pools' PartitionSpec: kv heads over the `kv_heads` rule's axis, pages with the slots."""
    from jax.sharding import PartitionSpec as P

    from t2t_jax import sharding

    rows, kv = sharding.spec(("batch", "kv_heads"), (slots, kv_heads), mesh)
    return P(kv, rows, None, None)


def pool_shards(mesh, slots: int) -> int:
    """How many shards the slots (and the pool's pages) split into under `mesh` (1 without)."""
    if mesh is None or mesh.size == 1:
        return 1
    from t2t_jax import sharding

    axes = sharding.spec(("batch",), (slots,), mesh)[0]
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = 1
    for a in axes:
        size *= mesh.shape[a]
    return size
