"""Config values as plain data, below every module that owns legal values (a leaf: it imports
nothing of t2t_jax).

    leaves({"grpo": {"steps": 3}})                       # {"grpo.steps": 3}
    parse_names("statistics, cases", SECTIONS, "engineer.sections")   # ("statistics", "cases")
    grpo_seed(config)                                    # the GRPO phase's seed (default: seed)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def leaves(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every leaf (`mesh` is one leaf: its axis names are free)."""
    out = {}
    for key, value in config.items():
        path = prefix + key
        if isinstance(value, Mapping) and path != "mesh":
            out.update(leaves(value, path + "."))
        else:
            out[path] = value
    return out


def parse_names(spec, legal, field: str) -> tuple[str, ...]:
    """ "a, b" -> ("a", "b"): comma-separated names, each one of `legal`, none twice ("" -> ()).
    ValueError names `field` and the first bad name."""
    if not isinstance(spec, str):
        raise ValueError(f"{field}: {spec!r} is not a string")
    names = tuple(x.strip() for x in spec.split(",") if x.strip())
    bad = [n for n in names if n not in legal]
    if bad:
        raise ValueError(f"{field}: {bad[0]!r} is not one of {tuple(legal)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{field}: a name appears twice in {spec!r}")
    return names


def grpo_seed(config) -> int:
    """The seed of the GRPO phase and the curriculum (`grpo_seed`; None or absent: the run's
    `seed`, as before the field existed), separate from the warm start's `seed`."""
    value = config.get("grpo_seed")
    return config["seed"] if value is None else value
