"""`EnvConfig`: a weighted mixture of `Bucket`s, the environment the engineer edits.

A bucket fixes or ranges each axis of the generator. In JSON an axis is a number or a
`[low, high]` pair (both ends included)::

    {"max_size": 10, "max_agents": 5,
     "buckets": [{"size": [3, 6], "agents": 2, "hole_density": [0.0, 0.3],
                  "min_distance": 1, "weight": 2.0},
                 {"size": 10, "agents": [4, 5], "hole_density": 0.5, "weight": 1.0}]}

Every field has a legal range and construction checks it, naming the field; a bucket that the
generator could not always satisfy is rejected here rather than hanging at generation.

Satisfiable means: for every size N in the bucket, with H = round(d_max * N^2) holes, the
worst case (most agents K, densest holes) still admits the generator's guaranteed fallback, a
monotone corridor of `min_distance + K - 1` moves carrying all agents (see generator.py):
`min_distance + K - 1 <= 2 (N - 1)` and `min_distance + K <= N^2 - H`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from t2t_jax.env.distances import MAX_PACKED_SIZE
from t2t_jax.errors import UserError

MIN_SIZE = 3
MAX_HOLE_DENSITY = 0.5
MAX_AGENT_SLOTS = 16


class ConfigError(UserError, ValueError):
    """An `EnvConfig` field outside its legal range, or an unsatisfiable bucket."""


def hole_count(density, size):
    """Holes on an N x N board at `density`: round-half-up of density * N^2 (float32 math, as
    the jitted generator does it). Works on Python numbers and NumPy / JAX arrays."""
    density = np.float32(density) if np.isscalar(density) else density.astype(np.float32)
    return (density * (size * size) + np.float32(0.5)) // 1


def _pair(value, name: str, kind) -> tuple:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ConfigError(f"{name}: expected a number or a [low, high] pair, got {value!r}")
        lo, hi = value
    else:
        lo = hi = value
    try:
        if kind is int and (
            isinstance(lo, bool) or isinstance(hi, bool) or float(lo) != int(lo) or float(hi) != int(hi)
        ):
            raise ConfigError(f"{name}: expected integers, got {value!r}")
        lo, hi = kind(lo), kind(hi)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{name}: expected {kind.__name__} values, got {value!r}") from None
    if lo > hi:
        raise ConfigError(f"{name}: low {lo} is above high {hi}")
    return lo, hi


def _check_range(name: str, pair: tuple, low, high) -> None:
    for v in pair:
        if not (low <= v <= high) or (isinstance(v, float) and not math.isfinite(v)):
            raise ConfigError(f"{name}: {v} is outside the legal range [{low}, {high}]")


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One mixture component. Ranges are inclusive `(low, high)` pairs.

    Attributes:
      size: board side N, legal within [3, max_size].
      agents: agent count K, legal within [1, max_agents].
      hole_density: fraction of the N^2 cells that are holes, legal within [0, 0.5]; each board
        draws d uniformly from the range and has exactly round(d * N^2) holes.
      min_distance: every agent's shortest start-goal distance is at least this (0 lets a start
        equal its goal), legal within [0, 2 (N_min - 1)].
      weight: relative probability of the bucket, > 0.
    """

    size: tuple[int, int] = (5, 5)
    agents: tuple[int, int] = (2, 2)
    hole_density: tuple[float, float] = (0.2, 0.2)
    min_distance: int = 1
    weight: float = 1.0

    def to_json(self) -> dict:
        def short(p):
            return p[0] if p[0] == p[1] else list(p)

        return {
            "size": short(self.size),
            "agents": short(self.agents),
            "hole_density": short(self.hole_density),
            "min_distance": self.min_distance,
            "weight": self.weight,
        }


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """A weighted mixture of buckets plus the static padding of every batch.

    Attributes:
      buckets: the mixture, at least one.
      max_size: static maximum board side S (the padded grid), legal within [3, 31].
      max_agents: static number of agent slots A, legal within [1, 16].
    """

    buckets: tuple[Bucket, ...]
    max_size: int = 10
    max_agents: int = 5

    def __post_init__(self):
        object.__setattr__(self, "buckets", tuple(self.buckets))
        validate(self)

    @property
    def weights(self) -> np.ndarray:
        """[num_buckets] float, normalised bucket probabilities."""
        w = np.array([b.weight for b in self.buckets], np.float64)
        return w / w.sum()

    def to_json(self) -> dict:
        return {
            "max_size": self.max_size,
            "max_agents": self.max_agents,
            "buckets": [b.to_json() for b in self.buckets],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, data: dict | str) -> EnvConfig:
        """Build from a dict or JSON text; raises `ConfigError` naming any bad field."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise ConfigError(f"config: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"buckets", "max_size", "max_agents"}
        if unknown:
            raise ConfigError(f"config: unknown fields {sorted(unknown)}")
        raw = data.get("buckets")
        if not isinstance(raw, list) or not raw:
            raise ConfigError("buckets: expected a non-empty list of bucket objects")
        buckets = [bucket_from_json(b, f"buckets[{i}]") for i, b in enumerate(raw)]
        max_size = _pair(data.get("max_size", 10), "max_size", int)[0]
        max_agents = _pair(data.get("max_agents", 5), "max_agents", int)[0]
        return cls(buckets=tuple(buckets), max_size=max_size, max_agents=max_agents)


def bucket_from_json(data: Any, where: str = "bucket") -> Bucket:
    """One bucket from its JSON dict (axes as numbers or [low, high])."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object, got {data!r}")
    fields = {f.name for f in dataclasses.fields(Bucket)}
    unknown = set(data) - fields
    if unknown:
        raise ConfigError(f"{where}: unknown fields {sorted(unknown)} (known: {sorted(fields)})")
    default = Bucket()
    return Bucket(
        size=_pair(data.get("size", default.size), f"{where}.size", int),
        agents=_pair(data.get("agents", default.agents), f"{where}.agents", int),
        hole_density=_pair(data.get("hole_density", default.hole_density), f"{where}.hole_density", float),
        min_distance=_pair(data.get("min_distance", default.min_distance), f"{where}.min_distance", int)[0],
        weight=_pair(data.get("weight", default.weight), f"{where}.weight", float)[0],
    )


def validate(config: EnvConfig) -> None:
    """Raise `ConfigError` for any field outside its legal range or an unsatisfiable bucket."""
    _check_range("max_size", (config.max_size,), MIN_SIZE, MAX_PACKED_SIZE)
    _check_range("max_agents", (config.max_agents,), 1, MAX_AGENT_SLOTS)
    if not config.buckets:
        raise ConfigError("buckets: at least one bucket is required")
    for i, b in enumerate(config.buckets):
        where = f"buckets[{i}]"
        for name in ("size", "agents", "hole_density"):
            pair = getattr(b, name)
            if not isinstance(pair, tuple) or len(pair) != 2 or pair[0] > pair[1]:
                raise ConfigError(f"{where}.{name}: expected a (low, high) pair, got {pair!r}")
        _check_range(f"{where}.size", b.size, MIN_SIZE, config.max_size)
        _check_range(f"{where}.agents", b.agents, 1, config.max_agents)
        _check_range(f"{where}.hole_density", b.hole_density, 0.0, MAX_HOLE_DENSITY)
        _check_range(f"{where}.min_distance", (b.min_distance,), 0, 2 * (b.size[0] - 1))
        if not (b.weight > 0 and math.isfinite(b.weight)):
            raise ConfigError(f"{where}.weight: {b.weight} is outside the legal range (0, inf)")
        k, m = b.agents[1], b.min_distance
        for n in range(b.size[0], b.size[1] + 1):
            holes = int(hole_count(b.hole_density[1], n))
            if m + k - 1 > 2 * (n - 1) or m + k > n * n - holes:
                raise ConfigError(
                    f"{where}: unsatisfiable: {k} agents with min_distance {m} on {n}x{n} at "
                    f"hole_density {b.hole_density[1]} ({holes} holes); the generator needs "
                    f"min_distance + agents - 1 <= 2*(size-1) = {2 * (n - 1)} and "
                    f"min_distance + agents <= free cells = {n * n - holes}"
                )


def make_config(buckets: Sequence[dict | Bucket], max_size: int = 10, max_agents: int = 5) -> EnvConfig:
    """Convenience: `make_config([{"size": 5, "agents": [2, 3]}])`."""
    return EnvConfig(
        buckets=tuple(
            b if isinstance(b, Bucket) else bucket_from_json(b, f"buckets[{i}]") for i, b in enumerate(buckets)
        ),
        max_size=max_size,
        max_agents=max_agents,
    )


def load_config(spec: str) -> EnvConfig:
    """An EnvConfig from a JSON file path or inline JSON text (`{"buckets": [...]}`)."""
    text = spec
    if not spec.lstrip().startswith("{"):
        try:
            with open(spec) as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"config: cannot read {spec!r} ({e.strerror})") from None
    return EnvConfig.from_json(text)
