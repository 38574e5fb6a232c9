"""The paged KV cache (t2t_jax/models/paged.py, the engine's kv="paged"): it and the dense cache
keep one protocol (models/base.py) and step alike through the model; one decode step's
attention by the Pallas kernel (interpret mode) and by the gathered pages equals dense attention
over the same tokens; the paged engine gives the dense engine's tokens, with a pool too small
for every slot too (rows wait, are preempted and recomputed to the same tokens), without
recompiling across calls; a request the pool cannot hold is refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t_jax.models import attention, paged, qwen3
from t2t_jax.models.base import Cache, SlotCache
from t2t_jax.sampling import Engine
from t2t_jax.sampling.pages import PageTable

MODEL = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
STOPS = [7, 11, 13, 17, 19, 23, 29, 31]  # (random weights: some rows stop early, others run to the budget)
IDS = np.asarray(jax.random.randint(jax.random.key(1), (6, 24), 40, 1000))
MASK = np.arange(24)[None] >= np.array([0, 3, 10, 20, 1, 5])[:, None]  # left padding


def same(got, ref):
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_array_equal(got.lengths, ref.lengths)
    np.testing.assert_array_equal(got.truncated, ref.truncated)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)


def test_both_layouts_keep_the_cache_protocol_and_step_alike():
    """The dense and the paged cache are `SlotCache`s: prompts admitted from the same prefill, one
    decode step through the model (which never asks the layout) gives the same logits and moves
    the same rows on; `take` and `put` are inverses."""
    ids, mask = jnp.asarray(IDS[:4]), jnp.asarray(MASK[:4])
    _, pre = MODEL.hidden(ids, mask, cache=MODEL.init_cache(4, 24), prefill=True)
    rows = jnp.array([2, 0, 3, 1])  # (slot i takes prompt rows[i])
    real = MASK[:4].sum(axis=1)[np.asarray(rows)]
    table = PageTable(4, pages=1 + 4 * 4, page_size=8, pages_per_slot=4)
    for slot, held in enumerate(real):
        assert table.grow(slot, int(held) + 1)
    caches = {
        "dense": MODEL.init_cache(4, 32).replace(index=jnp.zeros(4, jnp.int32)),  # (an index per slot)
        "paged": MODEL.init_paged_cache(4, 1 + 4 * 4, 8, 4).with_table(table.table),
    }
    active = jnp.array([True, True, False, True])
    tok = ids[rows, -1:]
    logits, moved = {}, {}
    for name, cache in caches.items():
        assert isinstance(cache, Cache) and isinstance(cache, SlotCache), name
        cache = cache.admit(pre, rows, jnp.arange(4))
        idx = jnp.array([3, 1])
        back = cache.put(cache.take(idx, 2), idx, 2)
        assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), back, cache)), name
        out, after = MODEL(tok, active[:, None], cache=cache, layers=MODEL.unstack_layers())
        logits[name], moved[name] = np.asarray(out[:, -1]), after
    np.testing.assert_allclose(logits["paged"][active], logits["dense"][active], atol=1e-5)
    np.testing.assert_array_equal(moved["paged"].lengths, real + np.asarray(active))
    np.testing.assert_array_equal(moved["dense"].next_pos, real + np.asarray(active))
    assert caches["dense"].columns() == 32 and caches["paged"].columns() == 4


@pytest.mark.parametrize("kernel", ["paged", "gather"])
def test_one_decode_step_attends_as_dense_attention_over_the_slots_tokens(kernel):
    s, h, kv, e, page, n = 4, 4, 2, 32, 8, 4
    lengths = np.array([0, 5, 17, 31], np.int32)  # tokens held before the step (31 + 1 fills 4 pages)
    active = np.array([True, True, True, True])
    rng = np.random.default_rng(0)
    keys, values = (rng.standard_normal((s, kv, 32, e)).astype(np.float32) for _ in range(2))
    q = jnp.asarray(rng.standard_normal((s, h, 1, e)), jnp.float32)
    table = PageTable(s, pages=1 + s * n, page_size=page, pages_per_slot=n)
    for slot in rng.permutation(s):  # (pages handed out in a shuffled order: not contiguous)
        assert table.grow(int(slot), int(lengths[slot]) + 1)
    cache = paged.empty(1, kv, e, slots=s, pages=1 + s * n, page_size=page, pages_per_slot=n, dtype=jnp.float32)
    tab = jnp.asarray(table.table)
    k_pool = paged.fill(cache.k[0], jnp.asarray(keys), tab, jnp.asarray(lengths))
    v_pool = paged.fill(cache.v[0], jnp.asarray(values), tab, jnp.asarray(lengths))  # (the last `lengths` real)
    new_k, new_v = (jnp.asarray(rng.standard_normal((s, kv, 1, e)), jnp.float32) for _ in range(2))
    out, k_pool, v_pool = paged.decode_attention(
        q, new_k, new_v, k_pool, v_pool, tab, jnp.asarray(lengths), jnp.asarray(active), kernel
    )
    # the reference: each slot's real tokens then the new one, dense attention over them
    t = 33
    k_all = np.zeros((s, kv, t, e), np.float32)
    v_all = np.zeros((s, kv, t, e), np.float32)
    for i, n_real in enumerate(lengths):
        k_all[i, :, :n_real], v_all[i, :, :n_real] = keys[i, :, 32 - n_real :], values[i, :, 32 - n_real :]
        k_all[i, :, n_real], v_all[i, :, n_real] = new_k[i, :, 0], new_v[i, :, 0]
    mask = (np.arange(t)[None] <= lengths[:, None])[:, None, :]
    ref = attention.dense(q, jnp.asarray(k_all), jnp.asarray(v_all), jnp.asarray(mask))
    tol = 3e-2 if kernel == "paged" else 1e-5  # (the kernel reads K/V in bfloat16)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=tol)
    for pool, x in ((k_pool, new_k), (v_pool, new_v)):  # the new token went to its slot's page at its length
        for i, n_real in enumerate(lengths):
            page_id = table.table[i, n_real // page]
            np.testing.assert_array_equal(np.asarray(pool[:, page_id, n_real % page]), np.asarray(x[i, :, 0]))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_paged_engine_gives_the_dense_engines_tokens(temperature):
    kw = dict(temperature=temperature, n=3, seed=5)
    ref = Engine(MODEL, STOPS, 0, slots=5, chunk=7).generate(IDS, MASK, 40, **kw)
    engine = Engine(MODEL, STOPS, 0, slots=5, chunk=7, kv="paged", page_size=8)
    same(engine.generate(IDS, MASK, 40, **kw), ref)
    assert engine.stats["preempted"] == 0  # (the default pool holds every slot at its full length)
    assert engine.stats["pool_pages"] == 5 * 8 + 1  # (64-token slots of 8-token pages, and the null page)


def test_a_small_pool_makes_rows_wait_and_recompute_to_the_same_tokens():
    budgets = np.array([1, 40, 3, 17, 40, 8] * 2, np.int32)
    kw = dict(temperature=1.0, n=2, seed=3)
    ref = Engine(MODEL, STOPS, 0, slots=4, chunk=5).generate(IDS, MASK, budgets, **kw)
    engine = Engine(MODEL, STOPS, 0, slots=4, chunk=5, kv="paged", page_size=8, pages=10)
    got = engine.generate(IDS, MASK, budgets, **kw)
    same(got, ref)
    assert engine.stats["preempted"] > 0 and engine.stats["recomputed_tokens"] > 0
    assert engine.stats["useful_tokens"] == int(np.asarray(ref.lengths).sum())  # (recomputed tokens not counted)
    compiled = engine.compilations()
    engine.generate(IDS, MASK, budgets[::-1].copy(), temperature=0.7, n=2, seed=4)
    assert engine.compilations() == compiled


def test_a_request_the_pool_cannot_hold_is_refused_by_name():
    engine = Engine(MODEL, STOPS, 0, slots=4, chunk=5, kv="paged", page_size=8, pages=4)  # 3 pages: 24 tokens
    with pytest.raises(ValueError, match="rollout.pages: a request needs 64 tokens"):
        engine.generate(IDS, MASK, 40)
    with pytest.raises(ValueError, match="rollout.kv"):
        Engine(MODEL, STOPS, 0, kv="ragged")


def test_page_table_hands_out_each_page_once_and_takes_them_back():
    table = PageTable(slots=4, pages=8, page_size=4, pages_per_slot=4, shards=2)  # shards of 4 pages, 3 usable
    assert table.grow(0, 9)  # 3 pages
    assert not table.grow(1, 1)  # (slot 1 shares shard 0: nothing left)
    assert table.grow(2, 12) and not table.grow(3, 1)
    assert sorted(table.table[0, :3]) == [1, 2, 3] and sorted(table.table[2, :3]) == [1, 2, 3]  # (local ids)
    table.release(0)
    assert table.in_use() == 3 and table.grow(1, 5) and table.capacity() == 12
    with pytest.raises(ValueError, match="rollout.pages"):
        PageTable(slots=4, pages=3, page_size=4, pages_per_slot=4, shards=2)


@pytest.mark.slow
def test_the_engine_through_the_pallas_kernel_gives_the_dense_tokens():
    """The TPU path end to end, in Pallas interpret mode: splash prefill, paged decode kernel (K/V
    read in bfloat16: the same tokens here, log-probs within 1e-2), a pool small enough to preempt."""
    kernels = qwen3.Qwen3(qwen3.PRESETS["tiny"], attention="splash", rngs=nnx.Rngs(0))
    ids, mask = IDS[:2], MASK[:2]
    ref = Engine(MODEL, STOPS, 0, slots=4, chunk=4).generate(ids, mask, 12, temperature=1.0, n=2, seed=5)
    engine = Engine(kernels, STOPS, 0, slots=4, chunk=4, kv="paged", page_size=8, pages=9)
    got = engine.generate(ids, mask, 12, temperature=1.0, n=2, seed=5)
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-2)
    assert engine.stats["preempted"] > 0
