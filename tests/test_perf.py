"""t2t_jax/perf.py: phases charged to the outermost one, work counted only where charged, MFU
from the devices' peak, and the model-FLOPs count of a training step."""

import time
from types import SimpleNamespace

import pytest

from t2t_jax.models import qwen3
from t2t_jax.perf import PhaseTimer, model_flops


def test_nested_phases_charge_the_outermost_and_count_its_work():
    timer = PhaseTimer()
    with timer.phase("evaluation"):
        with timer.phase("generation"):  # (an evaluation's own generation)
            time.sleep(0.02)
            timer.add("generation", tokens=100)
    with timer.phase("generation"):
        time.sleep(0.01)
        timer.add("generation", tokens=50)
    timer.add("generation", tokens=1000)  # (outside any phase: not counted)
    totals = timer.totals()
    assert set(totals) == {"evaluation", "generation"}
    assert totals["evaluation"]["seconds"] >= 0.02 and "tokens" not in totals["evaluation"]
    assert totals["generation"]["tokens"] == 50
    # (seconds are rounded to the millisecond: compare the time the rate implies with them)
    assert 50 / totals["generation"]["tokens_per_s"] == pytest.approx(totals["generation"]["seconds"], abs=6e-4)
    timer.reset()
    assert timer.totals() == {}


def test_mfu_is_model_flops_per_second_over_the_devices_peak():
    timer = PhaseTimer()
    with timer.phase("update"):
        time.sleep(0.05)
        timer.add("update", tokens=10, flops=197e12 * 0.05)  # one v5e chip's peak for the phase's length
    chips = [SimpleNamespace(device_kind="TPU v5 lite")] * 2
    mfu = timer.totals(chips)["update"]["mfu"]
    assert 0.3 < mfu <= 0.5  # (two chips: half of one chip's peak, less the sleep's overshoot)
    assert "mfu" not in timer.totals([SimpleNamespace(device_kind="cpu")])["update"]


def test_a_training_token_costs_six_flops_per_weight_plus_attention():
    c = qwen3.PRESETS["qwen3-4b"]
    weights = qwen3.num_params(c) - c.hidden_size  # (tied embeddings: the head's matmul, once)
    attention = 3 * 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * (2048 / 2)
    assert model_flops(c, "train", 1, 2048) == pytest.approx(2048 * (6 * weights + attention))
    assert model_flops(c, "decode", 64, 1, cache_length=8192) == pytest.approx(
        64 * (2 * weights + 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * 8192)
    )
