"""The continuous-batching engine (t2t_jax/sampling/engine.py) gives each request the Sampler's
output for the same seed (greedy and sampled, with fewer slots than rows so rows queue and
slots are reused), honours per-row budgets and constraints, and does not recompile across calls;
each call allocates the cache it needs (a long call leaves no trace on later small ones, a failed
allocation none at all); over processes it reads back what spans them."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from t2t_jax.engineer import propose
from t2t_jax.env.config import make_config
from t2t_jax.models import qwen3
from t2t_jax.sampling import Constraint, Engine, Sampler
from t2t_jax.sampling import slots as slots_lib
from t2t_jax.sampling.scheduler import slot_tokens
from t2t_jax.text.prompts import encode_texts
from t2t_jax.text.tokenizer import load_tokenizer, stop_ids

MODEL = qwen3.Qwen3(qwen3.PRESETS["tiny"], rngs=nnx.Rngs(0))
STOPS = [7, 11, 13, 17, 19, 23, 29, 31]  # (random weights: some rows stop early, others run to the budget)
IDS = np.asarray(jax.random.randint(jax.random.key(1), (6, 24), 40, 1000))
MASK = np.arange(24)[None] >= np.array([0, 3, 10, 20, 1, 5])[:, None]  # left padding


def assert_same(got, ref, budgets=None):
    ref = {k: np.asarray(getattr(ref, k)) for k in ("tokens", "logprobs", "lengths", "truncated")}
    if budgets is not None:  # the reference ran to the largest budget: cut each row at its own
        cut = np.arange(ref["tokens"].shape[1])[None] >= budgets[:, None]
        stopped = ~ref["truncated"] & (ref["lengths"] <= budgets)
        ref = {
            "tokens": np.where(cut, 0, ref["tokens"]),
            "logprobs": np.where(cut, 0, ref["logprobs"]),
            "lengths": np.minimum(ref["lengths"], budgets),
            "truncated": ~stopped,
        }
    np.testing.assert_array_equal(got.tokens, ref["tokens"])
    np.testing.assert_array_equal(got.lengths, ref["lengths"])
    np.testing.assert_array_equal(got.truncated, ref["truncated"])
    np.testing.assert_allclose(got.logprobs, ref["logprobs"], atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_request_gets_the_samplers_output_whatever_its_slot(temperature):
    stops = STOPS
    if temperature == 0:  # greedy rows of random weights repeat themselves: stop on tokens some rows make
        free = np.asarray(Sampler(MODEL, [], pad_id=0).generate(IDS, MASK, 40, n=3).tokens)
        stops = [int(free[0, 20]), int(free[9, 3])]
    ref = Sampler(MODEL, stops, pad_id=0).generate(IDS, MASK, 40, temperature=temperature, n=3, seed=5)
    engine = Engine(MODEL, stops, pad_id=0, slots=5, chunk=7)  # 18 rows through 5 slots
    got = engine.generate(IDS, MASK, 40, temperature=temperature, n=3, seed=5)
    assert_same(got, ref)
    assert 0 < (~np.asarray(ref.truncated)).sum() < 18  # (both kinds of rows are in the test)
    assert engine.stats["useful_tokens"] == int(np.asarray(ref.lengths).sum())


def test_per_row_budgets_and_no_recompilation_across_calls():
    budgets = np.array([1, 40, 3, 17, 40, 8] * 2, np.int32)
    ref = Sampler(MODEL, STOPS, pad_id=0).generate(IDS, MASK, 40, temperature=1.0, n=2, seed=3)
    engine = Engine(MODEL, STOPS, pad_id=0, slots=4, chunk=5)
    assert_same(engine.generate(IDS, MASK, budgets, temperature=1.0, n=2, seed=3), ref, budgets)
    compiled = engine.compilations()
    again = engine.generate(IDS, MASK, budgets[::-1].copy(), temperature=0.7, n=2, seed=4)
    assert engine.compilations() == compiled  # (other budgets, seed and temperature: the same shapes)
    assert (again.lengths <= budgets[::-1]).all()


def test_constrained_rows_follow_the_schema_as_the_samplers_do():
    tok = load_tokenizer()
    schema = propose.proposal_schema(make_config([{"size": [3, 5], "agents": 2}]), (1, 5))
    constraint = Constraint.from_json_schema(schema, tok)
    ids, mask = encode_texts(tok, ["propose", "a config please"])
    kw = dict(temperature=1.0, n=3, seed=0, constraint=constraint)
    ref = Sampler(MODEL, stop_ids(tok), tok.pad_token_id).generate(ids, mask, 300, **kw)
    got = Engine(MODEL, stop_ids(tok), tok.pad_token_id, slots=4, chunk=16).generate(ids, mask, 300, **kw)
    assert_same(got, ref)
    assert not got.truncated.any()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="slots"):
        Engine(MODEL, STOPS, 0, slots=0)


def test_check_runs_between_chunks_and_its_exception_stops_the_decode():
    """`check` is called before every decode chunk; what it raises ends the call there (the
    stage loop's SIGTERM), and the engine serves the next call as before."""

    class Stop(Exception):
        pass

    engine = Engine(MODEL, [], pad_id=0, slots=4, chunk=5)  # (no stop ids: every row runs 40 steps)
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise Stop

    with pytest.raises(Stop):
        engine.generate(IDS, MASK, 40, n=2, check=check)
    assert engine.stats == {"decode_calls": 2}  # two chunks ran, the third was never started
    ref = Sampler(MODEL, [], pad_id=0).generate(IDS, MASK, 40, n=2)
    assert_same(engine.generate(IDS, MASK, 40, n=2), ref)


def test_slot_tokens_is_what_a_call_needs_in_a_few_sizes():
    assert slot_tokens(512 + 8192) == slot_tokens(512 + 8192, page_size=64) == 8704  # (the paper config)
    assert slot_tokens(100, page_size=64) == 128 and slot_tokens(64) == 64
    sizes = [slot_tokens(t) for t in range(1, 20_000)]
    assert all(t <= got <= max(t + 15, t * 17 / 16) for t, got in enumerate(sizes, 1))  # (at most 1/16 over)
    assert sizes == sorted(sizes) and len(set(sizes[8192:16384])) == 16  # (16 sizes per octave)


def test_a_long_call_leaves_later_small_calls_as_they_were():
    """The cache is sized per call: after a long budget, a small call allocates its own small cache
    again (the same shapes, nothing compiled, the same tokens)."""
    engine = Engine(MODEL, STOPS, pad_id=0, slots=4, chunk=5)
    small = engine.generate(IDS, MASK, 8, temperature=1.0, n=2, seed=3)
    assert engine.length == engine.stats["slot_tokens"] == slot_tokens(24 + 8) == 32
    engine.generate(IDS[:1], MASK[:1], 120, temperature=1.0, seed=3)
    assert engine.length == slot_tokens(24 + 120) == 144
    compiled = engine.compilations()
    assert_same(engine.generate(IDS, MASK, 8, temperature=1.0, n=2, seed=3), small)
    assert engine.length == 32 and engine.compilations() == compiled


def test_a_failed_allocation_leaves_the_engine_as_it_was(monkeypatch):
    """A cache that cannot be allocated (out of memory) fails its call only: the engine keeps the
    size it had, and the next call is served as before."""

    class OutOfMemory(Exception):
        pass

    empty = slots_lib.empty

    def allocate(graphdef, state, pad_id, *, slots, length, width, page_size=0, pages=0):
        if length > 64:
            raise OutOfMemory(f"RESOURCE_EXHAUSTED: {slots} slots of {length} tokens")
        return empty(graphdef, state, pad_id, slots=slots, length=length, width=width, page_size=page_size, pages=pages)

    monkeypatch.setattr(slots_lib, "empty", allocate)
    engine = Engine(MODEL, STOPS, pad_id=0, slots=4, chunk=5)
    ref = engine.generate(IDS, MASK, 8, temperature=1.0, n=2, seed=3)
    sizes = engine.length, engine.width
    with pytest.raises(OutOfMemory):
        engine.generate(IDS, MASK, 4000, temperature=1.0, n=2, seed=3)
    assert (engine.length, engine.width) == sizes == (32, 16)
    compiled = engine.compilations()  # (the failed trace counts as an entry of the allocation's jit)
    assert_same(engine.generate(IDS, MASK, 8, temperature=1.0, n=2, seed=3), ref)
    assert engine.compilations() == compiled  # (the small call's shapes, as before)


@pytest.mark.slow  # (~140 s on a shared 2-core machine: two processes of 2 fake devices each)
def test_the_engine_over_two_processes_gives_each_the_samplers_tokens():
    """A mesh over both processes, the prompts' rows split across them: what the engine reads
    back spans the processes (tests/sharded_check.py multihost; `np.asarray` refused it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = os.path.join(os.path.dirname(__file__), "sharded_check.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, "multihost", str(port), str(i), "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    for i, (out, _) in enumerate(outs):
        assert out.count("ok multihost") == 2 and f"paged {i}" in out
