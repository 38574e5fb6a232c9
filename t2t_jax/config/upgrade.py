"""Runs begun by older code, read as today's: every fallback for an old run in one place.

    config = upgrade_config(json.load(open("run/config.json")))   # fields added since: filled

A field added after a run began is absent from its config.json. It reads as the value that
reproduces what that run did: `ADDED_AS` where the new field's default changed the behaviour,
else today's default (`defaults.base()`, chosen when each field was added so that old runs
keep their behaviour). Without this a resume would see the absent field as a change to the
run's maths, and `launch.eval --run` would fail on the missing field.
"""

from __future__ import annotations

import copy
from typing import Any

from t2t_jax.config import defaults
from t2t_jax.fields import leaves

# Field -> the value a run made before the field existed behaved as (when not today's default).
ADDED_AS: dict[str, Any] = {
    "train.share_prompts": False,  # added with default True; before it every row ran in full
    "rollout.engine": "static",  # added with default "continuous"; before it the Sampler decoded each batch
    "rollout.kv": "dense",  # added with default "auto" (paged on TPU); before it the engine's cache was dense
}


def upgrade_config(config: dict) -> dict:
    """A copy of a run's config dict with every field it lacks filled (see the module docstring)."""
    out = copy.deepcopy(config)
    have = leaves(out)
    for field, value in leaves(defaults.base().to_dict()).items():
        if field in have:
            continue
        node, *path, leaf = [out, *field.split(".")]
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = copy.deepcopy(ADDED_AS.get(field, value))
    return out
