"""The jumanji environment: specs, stepping, wrappers, agreement with the validator."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import generator
from jumanji.types import StepType
from jumanji.wrappers import AutoResetWrapper, VmapWrapper

from t2t_jax.env import io
from t2t_jax.env.config import make_config
from t2t_jax.env.environment import MAPFFrozenLake
from t2t_jax.env.validator import validate

CONFIG = make_config([{"size": [3, 5], "agents": [2, 3], "hole_density": [0.0, 0.3]}])


def test_reset_and_specs():
    env = MAPFFrozenLake(CONFIG, generator=generator(CONFIG))
    state, ts = jax.jit(env.reset)(jax.random.key(0))
    env.observation_spec.validate(ts.observation)
    assert ts.step_type == StepType.FIRST
    assert env.action_spec.num_values.shape == (5,)
    np.testing.assert_array_equal(ts.observation.positions, state.board.starts)


def test_steps_agree_with_validator():
    """Random joint actions stepped one by one end exactly where the validator says."""
    env = MAPFFrozenLake(CONFIG, time_limit=8, generator=generator(CONFIG))
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    rng = np.random.default_rng(0)
    for seed in range(20):
        state, ts = reset(jax.random.key(seed))
        actions = rng.integers(0, 5, (5, 8))
        t = 0
        while not ts.last():
            state, ts = step(state, jnp.asarray(actions[:, t]))
            t += 1
        board = jax.tree.map(lambda x: x[None], state.board)
        k = int(board.agent_mask.sum())
        plans = io.plans_from_lists([[list(actions[j, :t]) for j in range(k)]], 5, 8)
        v = validate(board, plans)
        if float(ts.reward) == 1.0:
            assert bool(v.valid[0])
        elif float(ts.reward) == -1.0:
            assert bool(v.has_illegal_moves[0]) and int(v.first_violation_step[0]) == t
        else:
            assert ts.step_type == StepType.LAST and t == 8 and not bool(v.has_illegal_moves[0])


def test_vmap_and_auto_reset_wrappers():
    env = VmapWrapper(AutoResetWrapper(MAPFFrozenLake(CONFIG, generator=generator(CONFIG))))
    state, ts = jax.jit(env.reset)(jax.random.split(jax.random.key(1), 16))
    step = jax.jit(env.step)
    for i in range(6):
        state, ts = step(state, jax.random.randint(jax.random.key(i), (16, 5), 0, 5))
        last = np.asarray(ts.step_type) == StepType.LAST
        # Auto-reset: a finished episode hands back the next episode's first observation.
        assert (np.asarray(ts.observation.step_count)[last] == 0).all()
        assert (np.asarray(state.step_count)[last] == 0).all()
    assert ts.reward.shape == (16,)
