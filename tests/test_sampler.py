"""The sampler: greedy parity with transformers, sampling statistics, filters, compilations."""

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from test_qwen3 import hf_model

from t2t_jax.models import qwen3
from t2t_jax.sampling import Sampler, filter_logits


def left_pad(seqs, pad):
    p = max(len(s) for s in seqs)
    ids = np.full((len(seqs), p), pad, np.int64)
    mask = np.zeros((len(seqs), p), bool)
    for i, s in enumerate(seqs):
        ids[i, p - len(s) :] = s
        mask[i, p - len(s) :] = True
    return ids, mask


def test_greedy_matches_transformers_generate(tmp_path):
    ref = hf_model("gqa4", seed=5)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = qwen3.from_pretrained(str(tmp_path))
    rng = np.random.default_rng(0)
    ids, mask = left_pad([rng.integers(1, 97, n) for n in (7, 3, 10)], pad=0)
    stop = 96
    out = Sampler(model, stop_ids=[stop], pad_id=0).generate(ids, mask, max_new_tokens=12)
    with torch.no_grad():
        hf = ref.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=stop,
        )
    hf_new = hf[:, ids.shape[1] :].numpy()
    for row, (tokens, length) in enumerate(zip(np.asarray(out.tokens), np.asarray(out.lengths))):
        expect = list(hf_new[row])
        if stop in expect:
            expect = expect[: expect.index(stop) + 1]
        assert list(tokens[:length]) == expect[:length] and length == len(expect)


def small_model():
    config = qwen3.Qwen3Config(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return qwen3.Qwen3(config, rngs=nnx.Rngs(3))


def test_sampling_distribution_is_softmax_over_temperature():
    model = small_model()
    ids = jnp.array([[1, 2, 3, 4]])
    logits = np.asarray(model(ids))[0, -1]
    temperature, n = 0.7, 4000
    out = Sampler(model, stop_ids=[], pad_id=0).generate(
        ids, jnp.ones_like(ids, bool), max_new_tokens=1, temperature=temperature, n=n, seed=1
    )
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=16)
    p = np.exp(logits / temperature - np.max(logits / temperature))
    p /= p.sum()
    expected = p * n
    big = expected >= 5
    chi2 = ((counts[big] - expected[big]) ** 2 / expected[big]).sum() + (
        counts[~big].sum() - expected[~big].sum()
    ) ** 2 / max(expected[~big].sum(), 1e-9)
    assert chi2 < 40.0  # p ~ 0.001 at ~16 degrees of freedom
    # Log-probs are those of softmax(logits / T).
    np.testing.assert_allclose(np.asarray(out.logprobs[:, 0]), np.log(p)[np.asarray(out.tokens[:, 0])], atol=1e-4)


def test_top_k_and_top_p_stay_in_their_sets():
    model = small_model()
    ids = jnp.array([[5, 6, 7]])
    logits = np.asarray(model(ids))[0, -1]
    sampler = Sampler(model, stop_ids=[], pad_id=0)
    top3 = set(np.argsort(logits)[-3:])
    out = sampler.generate(ids, jnp.ones_like(ids, bool), max_new_tokens=1, temperature=1.5, top_k=3, n=500)
    assert set(np.asarray(out.tokens[:, 0]).tolist()) <= top3
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    nucleus = set(order[: np.searchsorted(np.cumsum(probs[order]), 0.6) + 1])
    out = sampler.generate(ids, jnp.ones_like(ids, bool), max_new_tokens=1, temperature=1.0, top_p=0.6, n=500)
    assert set(np.asarray(out.tokens[:, 0]).tolist()) <= nucleus
    # The log-probs stay those of the full softmax (the trainer's), not of the renormalised nucleus.
    np.testing.assert_allclose(np.asarray(out.logprobs[:, 0]), np.log(probs)[np.asarray(out.tokens[:, 0])], atol=1e-5)
    assert filter_logits(jnp.array([[0.0, 1.0, 5.0]]), 0, 0.01).tolist() == [[-np.inf, -np.inf, 5.0]]


def test_stops_lengths_truncation_and_groups():
    model = small_model()
    ids = jnp.array([[0, 1, 2], [3, 4, 5]])
    mask = jnp.array([[False, True, True], [True, True, True]])
    sampler = Sampler(model, stop_ids=[7, 9], pad_id=0)
    out = sampler.generate(ids, mask, max_new_tokens=20, temperature=1.0, n=4, seed=3)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    assert tokens.shape == (8, 20)
    for row, length in enumerate(lengths):
        stopped = not bool(out.truncated[row])
        if stopped:
            assert tokens[row, length - 1] in (7, 9) and not set(tokens[row, : length - 1]) & {7, 9}
            assert (tokens[row, length:] == 0).all()
        else:
            assert length == 20
    # Different seeds give different samples; the same seed the same ones.
    again = sampler.generate(ids, mask, max_new_tokens=20, temperature=1.0, n=4, seed=3)
    np.testing.assert_array_equal(np.asarray(again.tokens), tokens)


def test_no_recompilation_across_calls():
    model = small_model()
    sampler = Sampler(model, stop_ids=[7], pad_id=0)
    rng = np.random.default_rng(0)
    counts = []
    for i in range(4):
        ids = jnp.asarray(rng.integers(0, 16, (2, 6)))
        sampler.generate(
            ids,
            jnp.ones_like(ids, bool),
            max_new_tokens=5,
            temperature=float(i) / 2,
            top_k=i,
            top_p=1.0 - 0.1 * i,
            seed=i,
        )
        counts.append(sampler.compilations())
    assert counts[1:] == counts[:1] * 3  # new prompts and sampling parameters: no new compile
