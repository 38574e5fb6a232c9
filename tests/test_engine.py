"""The continuous-batching engine (t2t_jax/sampling/engine.py) gives each request the Sampler's
output for the same seed (greedy and sampled, with fewer slots than rows so rows queue and
slots are reused), honours per-row budgets and constraints, and does not recompile across calls."""

import jax
import numpy as np
import pytest
from flax import nnx

from t2t_jax.engineer import propose
from t2t_jax.env.config import make_config
from t2t_jax.models import qwen3
from t2t_jax.sampling import Constraint, Engine, Sampler
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

    decoded = []
    decode = engine._decode
    engine._decode = lambda *a, **k: decoded.append(1) or decode(*a, **k)
    with pytest.raises(Stop):
        engine.generate(IDS, MASK, 40, n=2, check=check)
    assert len(decoded) == 2  # two chunks ran, the third was never started
    engine._decode = decode
    ref = Sampler(MODEL, [], pad_id=0).generate(IDS, MASK, 40, n=2)
    assert_same(engine.generate(IDS, MASK, 40, n=2), ref)
