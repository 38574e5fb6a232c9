"""The curriculum testbed (issue 32): the GRPO phase's own seed (`grpo_seed`), runs of an arm
sharing one warm start (launch.study --grpo_seeds), the target distribution (`eval.target`) in
the points and the study, `configs/curriculum.py` and its arms."""

import ml_collections as mlc

from t2t_jax import fields
from t2t_jax.config.defaults import base
from t2t_jax.loop import Loop
from t2t_jax.rl.step import StepSettings


def test_grpo_seed_defaults_to_the_seed_and_splits_the_grpo_phase_from_the_warm_start():
    c = base()
    c.seed = 3
    loop = Loop(c, None, None, None, None, None, None)
    assert c.grpo_seed is None and fields.grpo_seed(c) == 3 and StepSettings.from_config(c).seed == 3
    assert (loop.grpo_key(100, 1) == loop.key(100, 1)).all()  # default: the keys of before, bit for bit
    c.grpo_seed = 7
    assert fields.grpo_seed(c) == 7 and StepSettings.from_config(c).seed == 7
    assert not (loop.grpo_key(100, 1) == loop.key(100, 1)).all()
    assert (loop.key(7) == Loop(mlc.ConfigDict({"seed": 3}), *[None] * 6).key(7)).all()  # the warm start's
    assert fields.grpo_seed({"seed": 2}) == 2  # a run begun before the field existed
