"""The train step: exact gradient accumulation, the NaN guard, sharded/multi-host equivalence,
and a small real learning test (GRPO raises a toy reward)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import free_port
from flax import nnx

from t2t_jax.models import qwen3
from t2t_jax.rl import grpo
from t2t_jax.rl.trainer import OptimSettings, Trainer, TrainingError, TrainSettings
from t2t_jax.sampling import Sampler

CONFIG = qwen3.Qwen3Config(
    vocab_size=16,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
HERE = os.path.dirname(__file__)


def settings(loss_type="dapo", micro_batches=1, lr=1e-2, beta=0.0, share_prompts=False, group_size=4, **optim):
    return TrainSettings(
        optim=OptimSettings(
            **dict(
                learning_rate=lr,
                warmup_steps=0,
                decay_steps=100,
                end_lr_fraction=1.0,
                b1=0.9,
                b2=0.99,
                weight_decay=0.0,
                max_grad_norm=10.0,
            )
            | optim
        ),
        loss=grpo.LossSettings(loss_type, epsilon_low=0.2, epsilon_high=0.28, beta=beta),
        micro_batches=micro_batches,
        max_bad_steps=2,
        logprob_chunk=3,
        temperature=1.0,
        group_size=group_size,
        share_prompts=share_prompts,
    )


def batch(rows=8, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "prompt_ids": rng.integers(0, 16, (rows, 5)).astype(np.int32),
        "prompt_mask": np.arange(5)[None] >= rng.integers(0, 3, rows)[:, None],
        "completion_ids": rng.integers(0, 16, (rows, 6)).astype(np.int32),
        "completion_mask": np.arange(6)[None] < rng.integers(1, 7, rows)[:, None],
        "advantages": rng.normal(size=rows).astype(np.float32),
        "old_logps": -rng.uniform(1, 4, (rows, 6)).astype(np.float32),
        "ref_logps": -rng.uniform(1, 4, (rows, 6)).astype(np.float32),
    }


def one_update(cfg, loss="grpo", data=None):
    trainer = Trainer(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), cfg, loss=loss)
    state, metrics = trainer.update(trainer.init(), trainer.shard(data or batch()))
    return jax.tree.map(np.asarray, state.params), metrics


@pytest.mark.parametrize(
    "loss_type",
    ["grpo", pytest.param("dr_grpo", marks=pytest.mark.slow), "dapo", pytest.param("sft", marks=pytest.mark.slow)],
)
def test_gradient_accumulation_equals_full_batch(loss_type):
    loss = "sft" if loss_type == "sft" else "grpo"
    full, m1 = one_update(settings("dapo" if loss == "sft" else loss_type, 1, beta=0.04), loss)
    acc, m4 = one_update(settings("dapo" if loss == "sft" else loss_type, 4, beta=0.04), loss)
    np.testing.assert_allclose(float(m4["loss"]), float(m1["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-4)
    for a, b in zip(jax.tree.leaves(acc), jax.tree.leaves(full)):
        np.testing.assert_allclose(a, b, atol=3e-5)


def grouped_batch(groups=4, group=4, seed=0):
    """`batch()` with one prompt per group of `group` consecutive rows, as GRPO rollouts are."""
    data = batch(groups * group, seed)
    for k in ("prompt_ids", "prompt_mask"):
        data[k] = np.repeat(data[k][::group], group, 0)
    return data


def test_shared_prompts_give_the_same_logprobs_and_update():
    """Each group's prompt run once (a prefill into a KV cache), in 2 micro-batches of whole
    groups = every row run in full, in one."""
    data = grouped_batch()
    full_cfg, shared_cfg = settings(beta=0.04), settings(beta=0.04, micro_batches=2, share_prompts=True)
    model = qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0))
    full, shared = Trainer(model, full_cfg), Trainer(model, shared_cfg)
    assert (full.group, shared.group) == (1, 4)
    arrays = full.shard(data)
    np.testing.assert_allclose(
        np.asarray(shared.logprobs(shared.initial_params, arrays)),
        np.asarray(full.logprobs(full.initial_params, arrays)),
        atol=2e-5,
    )
    p_full, m_full = one_update(full_cfg, data=data)
    p_shared, m_shared = one_update(shared_cfg, data=data)
    np.testing.assert_allclose(float(m_shared["loss"]), float(m_full["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m_shared["grad_norm"]), float(m_full["grad_norm"]), rtol=1e-4)
    for a, b in zip(jax.tree.leaves(p_shared), jax.tree.leaves(p_full)):
        np.testing.assert_allclose(a, b, atol=3e-5)


def test_shared_prompts_need_whole_groups_per_micro_batch():
    with pytest.raises(ValueError, match="micro_batches: 8 does not divide the batch of 16 rows in groups of 4"):
        one_update(settings(micro_batches=8, share_prompts=True), data=grouped_batch())


def test_non_finite_update_is_skipped_then_stops_the_run():
    cfg = settings()
    trainer = Trainer(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), cfg)
    state = trainer.init()
    before = jax.tree.map(np.asarray, state.params)
    data = batch()
    data["advantages"][0] = np.nan
    state, metrics = trainer.update(state, trainer.shard(data))
    assert bool(metrics["skipped"]) and int(metrics["bad_in_a_row"]) == 1
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(a), b)
    trainer.check_finite(metrics)  # one bad step is tolerated
    state, metrics = trainer.update(state, trainer.shard(data))
    with pytest.raises(TrainingError, match="2 updates in a row"):
        trainer.check_finite(metrics)
    state, metrics = trainer.update(state, trainer.shard(batch()))  # a finite step resets the count
    assert int(metrics["bad_in_a_row"]) == 0 and not bool(metrics["skipped"])


def test_micro_batches_must_divide_the_batch():
    with pytest.raises(ValueError, match="micro_batches: 3 does not divide"):
        one_update(settings(micro_batches=3))


def test_grpo_raises_a_toy_reward():
    """Reward = fraction of completion tokens equal to 7; GRPO must raise it (real learning)."""
    model = qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(1))
    trainer = Trainer(model, settings(lr=3e-3))
    sampler = Sampler(model, stop_ids=[15], pad_id=0)
    state = trainer.init()
    prompts = np.random.default_rng(0).integers(0, 15, (4, 4)).astype(np.int32)
    mask = np.ones_like(prompts, bool)
    means = []
    for step in range(25):
        out = sampler.generate(prompts, mask, max_new_tokens=6, temperature=1.0, n=8, seed=step, params=state.params)
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        comp = np.arange(6)[None] < lengths[:, None]
        reward = ((tokens == 7) & comp).sum(1) / np.maximum(lengths, 1)
        means.append(reward.mean())
        data = {
            "prompt_ids": np.repeat(prompts, 8, 0),
            "prompt_mask": np.repeat(mask, 8, 0),
            "completion_ids": tokens,
            "completion_mask": comp,
            "advantages": np.asarray(grpo.group_advantages(reward, 8)),
        }
        state, _ = trainer.update(state, trainer.shard(data))
    assert np.mean(means[-5:]) > np.mean(means[:5]) + 0.2, means


@pytest.mark.slow
def test_sharded_update_equals_single_device(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "train_check.py"), "sharded", str(tmp_path / "single.npz")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.count("ok ") == 5


@pytest.mark.slow
def test_two_process_run_equals_single_process(tmp_path):
    """Two processes on localhost (jax.distributed, gloo), 2 fake devices each, fsdp over all 4:
    the same params as one process on one device."""
    single = tmp_path / "single.npz"
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "train_check.py"), "sharded", str(single)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    port, multi = free_port(), tmp_path / "multi.npz"
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "train_check.py"), "multihost", str(port), str(i), "2", str(multi)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert "ok multihost 4 devices" in outs[0][0]
    a, b = np.load(multi), np.load(single)
    assert sorted(a.files) == sorted(b.files)
    for k in b.files:
        np.testing.assert_allclose(a[k], b[k], atol=2e-5, err_msg=k)


def test_first_update_of_a_warmup_schedule_moves():
    """optax's warmup is 0 at count 0; the schedule is read one count ahead, so update 0 of
    every schedule (SFT and GRPO) runs at learning_rate / warmup_steps, not 0."""
    from t2t_jax.rl.trainer import learning_rate_schedule

    cfg = settings(lr=1e-3, warmup_steps=4, decay_steps=20, end_lr_fraction=0.1)
    schedule = learning_rate_schedule(cfg.optim)
    assert [float(schedule(i)) for i in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert float(schedule(20)) == pytest.approx(1e-4)
    before = jax.tree.map(np.asarray, Trainer(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), cfg).initial_params)
    after, metrics = one_update(cfg)
    assert float(metrics["learning_rate"]) == pytest.approx(2.5e-4)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)))


def test_update_reports_the_sampler_to_trainer_log_ratio():
    """With the sampler's log-probs in the batch, the update logs trainer - sampler: the mean over
    the completion tokens of sampled rows, the max |.| across micro-batches; guided rows do not
    count."""
    data = batch()
    for micro_batches, guided in ((2, None), (1, 4)):
        trainer = Trainer(qwen3.Qwen3(CONFIG, rngs=nnx.Rngs(0)), settings(micro_batches=micro_batches))
        exact = np.asarray(trainer.logprobs(trainer.initial_params, trainer.shard(data)))
        shift = np.zeros_like(exact)
        shift[3] = 0.5  # row 3 (micro-batch 1 of 2): the sampler 0.5 nats below the trainer
        sampled = np.ones(8, bool)
        if guided is not None:
            shift[guided], sampled[guided] = 7.0, False
        _, metrics = trainer.update(
            trainer.init(), trainer.shard({**data, "sampler_logps": exact - shift, "sampled": sampled})
        )
        mask = data["completion_mask"] & sampled[:, None]
        assert float(metrics["sampler_logratio_max"]) == pytest.approx(0.5, abs=1e-4)
        assert float(metrics["sampler_logratio"]) == pytest.approx(0.5 * mask[3].sum() / mask.sum(), abs=1e-4)
