"""Qwen3: parity with transformers on tiny random checkpoints, round trip, KV cache, errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from t2t_jax.models import qwen3

CONFIGS = {
    "tied_gqa2": dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    ),
    "untied_gqa1_headdim": dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=24,
        tie_word_embeddings=False,
    ),
    "gqa4": dict(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    ),
}


def hf_model(name, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(vocab_size=97, max_position_embeddings=256, rms_norm_eps=1e-6, **CONFIGS[name])
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms, so a missed norm weight shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return model


def padded_batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 97, (3, 12))
    mask = np.ones((3, 12), bool)
    mask[1, :5] = False  # left padding
    mask[2, :11] = False
    return ids, mask


def hf_forward(model, ids, mask):
    """transformers' logits (a torch tensor) with positions from the mask, as ours."""
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    return model(
        input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)), position_ids=torch.tensor(pos)
    ).logits


def hf_logits(model, ids, mask):
    with torch.no_grad():
        return hf_forward(model, ids, mask).numpy()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name, tmp_path):
    ref = hf_model(name)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = qwen3.from_pretrained(str(tmp_path), dtype=jnp.float32)
    ids, mask = padded_batch()
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    theirs = hf_logits(ref, ids, mask)
    np.testing.assert_allclose(ours[mask], theirs[mask], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["tied_gqa2", "untied_gqa1_headdim"])
def test_save_pretrained_round_trip(name, tmp_path):
    ref = hf_model(name, seed=1)
    ref.save_pretrained(tmp_path / "hf", safe_serialization=True)
    model = qwen3.from_pretrained(str(tmp_path / "hf"))
    qwen3.save_pretrained(model, str(tmp_path / "ours"))
    again = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path / "ours")).eval()
    ids, mask = padded_batch(1)
    np.testing.assert_allclose(hf_logits(again, ids, mask)[mask], hf_logits(ref, ids, mask)[mask], atol=1e-5)
    assert not [p for p in os.listdir(tmp_path / "ours") if p.endswith(".tmp")]


@pytest.mark.parametrize("scan_layers", [True, False])
def test_cache_prefill_and_decode_match_full_forward(tmp_path, scan_layers):
    ref = hf_model("gqa4", seed=2)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = qwen3.from_pretrained(str(tmp_path), scan_layers=scan_layers)
    ids, mask = padded_batch(2)
    full = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    prompt = 8
    cache = model.init_cache(3, 16)
    logits, cache = model(jnp.asarray(ids[:, :prompt]), jnp.asarray(mask[:, :prompt]), cache=cache)
    steps = [np.asarray(logits)]
    for t in range(prompt, 12):
        logits, cache = model(jnp.asarray(ids[:, t : t + 1]), jnp.asarray(mask[:, t : t + 1]), cache=cache)
        steps.append(np.asarray(logits))
    stepped = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(stepped[mask], full[mask], atol=1e-5)
    assert int(cache.index) == 12


@pytest.mark.parametrize("name", ["tied_gqa2", "untied_gqa1_headdim"])
def test_gradients_match_transformers(name, tmp_path):
    """Every weight's gradient against torch autograd (our `dense` has a hand-written backward)."""
    from flax import nnx

    from t2t_jax.models.qwen3.model import named_params
    from t2t_jax.models.qwen3.params import HF_LAYER, hf_names

    ref = hf_model(name, seed=2)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = qwen3.from_pretrained(str(tmp_path))
    ids, mask = padded_batch(2)
    proj = np.random.default_rng(2).normal(size=(3, 12, 97)).astype(np.float32) * mask[..., None]
    graph, params = nnx.split(model)
    grads = nnx.merge(
        graph,
        jax.grad(lambda p: jnp.sum(nnx.merge(graph, p)(jnp.asarray(ids), attention_mask=jnp.asarray(mask)) * proj))(
            params
        ),
    )
    (hf_forward(ref, ids, mask) * torch.tensor(proj)).sum().backward()
    theirs = {n: p.grad.numpy() for n, p in ref.named_parameters()}
    for ours_name, param in named_params(grads).items():
        g = np.asarray(param.value)
        blocks = g if ours_name in HF_LAYER else g[None]
        for hf_name, block in zip(hf_names(model.config, ours_name), blocks, strict=True):
            np.testing.assert_allclose(block, theirs[hf_name], atol=2e-5, rtol=2e-4, err_msg=hf_name)


def test_bf16_forward_is_close(tmp_path):
    ref = hf_model("tied_gqa2", seed=3)
    ref.save_pretrained(tmp_path, safe_serialization=True)
    ids, mask = padded_batch(3)
    f32 = np.asarray(qwen3.from_pretrained(str(tmp_path))(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    bf16 = qwen3.from_pretrained(str(tmp_path), dtype=jnp.bfloat16)
    assert bf16.embed.value.dtype == jnp.bfloat16
    out = np.asarray(bf16(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    assert out.dtype == np.float32
    assert np.abs(out[mask] - f32[mask]).max() < 0.1


@pytest.mark.slow  # (~70 s of compiles; CI runs the slow set)
def test_remat_chunked_attention_and_unrolled_layers_give_the_same_gradients():
    config = qwen3.Qwen3Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    from flax import nnx

    ids = jnp.arange(24).reshape(2, 12) % 50
    mask = jnp.ones((2, 12), bool).at[1, :5].set(False)
    grads = []
    for remat, chunk, scan in (
        ("none", 0, True),
        ("full", 0, True),
        ("dots", 0, True),
        ("none", 4, True),
        ("full", 3, True),
        ("none", 5, True),
        ("none", 0, False),
        ("dots", 4, False),
    ):
        model = qwen3.Qwen3(config, remat=remat, attn_chunk=chunk, scan_layers=scan, rngs=nnx.Rngs(0))
        g = nnx.grad(lambda m: (m(ids, attention_mask=mask) * mask[..., None]).mean())(model)
        grads.append(jax.tree.leaves(nnx.state(g)))
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            np.testing.assert_allclose(a, b, atol=1e-6)


def test_clear_errors(tmp_path):
    with pytest.raises(qwen3.CheckpointError, match="no config.json"):
        qwen3.from_pretrained(str(tmp_path))
    ref = hf_model("tied_gqa2")
    ref.save_pretrained(tmp_path, safe_serialization=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(cfg | {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    with pytest.raises(ValueError, match="unsupported architecture"):
        qwen3.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 100}))
    with pytest.raises(
        qwen3.CheckpointError,
        match=r"tensor 'model.layers.0.mlp.\w+_proj.weight' has shape \[\d+, \d+\], expected .*100",
    ):
        qwen3.from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    os.remove(tmp_path / "model.safetensors")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(qwen3.CheckpointError, match="only safetensors"):
        qwen3.from_pretrained(str(tmp_path))
    # A sharded checkpoint's index may only name safetensors files of the directory itself.
    for target in ("../outside.safetensors", "/etc/passwd", "sub/model.safetensors", 3):
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"model.embed_tokens.weight": target}})
        )
        with pytest.raises(
            qwen3.CheckpointError,
            match=r"weight_map\['model.embed_tokens.weight'\] = .* is not a "
            r"\.safetensors file of the checkpoint directory",
        ):
            qwen3.from_pretrained(str(tmp_path))


def test_presets_have_published_sizes():
    sizes = {k: qwen3.num_params(c) / 1e9 for k, c in qwen3.PRESETS.items()}
    assert abs(sizes["qwen3-0.6b"] - 0.596) < 0.01 and abs(sizes["qwen3-4b"] - 4.02) < 0.01
    assert abs(sizes["qwen3-8b"] - 8.19) < 0.01 and not qwen3.PRESETS["qwen3-8b"].tie_word_embeddings


def test_chunked_token_logprobs_match_full_logits():
    from flax import nnx

    config = qwen3.Qwen3Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    model = qwen3.Qwen3(config, rngs=nnx.Rngs(1))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 50, (3, 23)))

    def full(m):
        logp = jax.nn.log_softmax(m(ids[:, :-1]) / 0.8, axis=-1)
        return jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]

    def chunked(m):
        return m.token_logprobs(m.hidden(ids[:, :-1]), ids[:, 1:], chunk=5, temperature=0.8)

    np.testing.assert_allclose(chunked(model), full(model), atol=1e-5)
    g_full = nnx.grad(lambda m: full(m).sum())(model)
    g_chunk = nnx.grad(lambda m: chunked(m).sum())(model)
    for a, b in zip(jax.tree.leaves(nnx.state(g_full)), jax.tree.leaves(nnx.state(g_chunk))):
        np.testing.assert_allclose(a, b, atol=1e-5)
