"""Preemption (t2t_jax/preemption.py): one wrapper for every unit of work. A stop seen inside a
unit checkpoints the state the unit began from; one seen after it checkpoints what it returned;
the routed SIGTERM of launch.main reaches the run from one waiting thread."""

import os
import subprocess
import sys

import pytest

from t2t_jax.preemption import Preempted, Preemption, Stopped
from t2t_jax.runrecord import RunRecord, RunState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def state(step: int) -> RunState:
    return RunState(train={"step": step}, ref={}, record=RunRecord("grpo", 0, step, 0, [], [], [], [], [], []))


def test_a_unit_without_a_stop_returns_its_value():
    saved = []
    p = Preemption(saved.append)
    assert p.guard(state(0), lambda: state(1)).record.step == 1
    assert p.guard(state(1), lambda: [1, 2]) == [1, 2]
    assert saved == [] and not p.requested


def test_a_stop_inside_a_unit_checkpoints_the_state_it_began_from():
    saved = []
    p = Preemption(saved.append)

    def unit():
        p.request()
        p.check()  # (between two parts of the unit)
        raise AssertionError("the check did not stop the unit")

    with pytest.raises(Preempted) as stopped:
        p.guard(state(3), unit)
    assert stopped.value.code == 0 and [s.record.step for s in saved] == [3]


def test_a_stop_after_a_unit_checkpoints_its_result_or_else_the_state_it_began_from():
    saved = []
    p = Preemption(saved.append)

    def unit(out):
        p.request()  # (the signal arrives after the unit's last check)
        return out

    with pytest.raises(Preempted):
        p.guard(state(4), lambda: unit(state(5)))
    with pytest.raises(Preempted):
        p.guard(state(6), lambda: unit(["boards"]))  # a unit that yields no RunState
    assert [s.record.step for s in saved] == [5, 6]


def test_check_is_silent_until_a_stop_is_requested():
    p = Preemption(lambda run: None)
    p.check()
    p.request()
    with pytest.raises(Stopped):
        p.check()


PROBE = """
import os, signal, sys, time
from t2t_jax import hostenv
hostenv.block_signal(signal.SIGTERM)
import numpy as np, jax  # (their thread pools start with SIGTERM blocked)
jax.numpy.ones(4).block_until_ready()
from t2t_jax import preemption
preemption.route_to_a_thread()
p = preemption.Preemption(lambda run: None)
with p.handling():
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not p._local and time.monotonic() < deadline:
        time.sleep(0.01)
    print("stop requested" if p.stop_requested() else "not requested", flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # outside a run: the signal's own action
time.sleep(10)
print("still alive")
"""


def test_a_routed_sigterm_requests_a_stop_and_outside_a_run_terminates():
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.stdout.strip() == "stop requested", out.stdout + out.stderr[-2000:]
    assert out.returncode == -15  # SIGTERM's own action, not a hang
