"""The paper's benchmark eval sets, shipped as JSON lines and loaded by name.

Protocol: a 3-agent set over map sizes 3x3..10x10, a 4-agent set over 4x4..10x10 and a 5-agent
set over 5x5..10x10, 150 boards per (agents, size) cell. Hole density is drawn per board
uniformly in [0, 0.5] (then exactly round(d N^2) holes); min_distance is 1. Every board carries
its certified `optimal_makespan`, `lower_bound` and `plan`, the witness in the text form.
Out-of-distribution sets for generalisation: `ood_6_agents` (6 agents on 6x6..10x10) and
`ood_dense` (5 agents on 5x5..10x10 at exactly 50% holes), 50 boards per cell.

Cell (k, n) of a set is generated with seed `SEED + 100 * k + n`, chunks of 256, horizon 64:
`python -m launch.mapf build_sets` regenerates the files and a test checks they match byte for
byte.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from t2t_jax.env import io
from t2t_jax.env.config import make_config
from t2t_jax.fields import parse_names

SEED = 20260101
DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
HORIZON, CHUNK = 64, 256


@dataclasses.dataclass(frozen=True)
class SetSpec:
    """agents: K; sizes: the map sides; boards: per (K, N) cell; density: (low, high)."""

    agents: int
    sizes: tuple[int, ...]
    boards: int = 150
    density: tuple[float, float] = (0.0, 0.5)

    @property
    def max_agents(self) -> int:
        return max(5, self.agents)


SETS = {
    "mapf_3_agents": SetSpec(3, tuple(range(3, 11))),
    "mapf_4_agents": SetSpec(4, tuple(range(4, 11))),
    "mapf_5_agents": SetSpec(5, tuple(range(5, 11))),
    "ood_6_agents": SetSpec(6, tuple(range(6, 11)), boards=50),
    "ood_dense": SetSpec(5, tuple(range(5, 11)), boards=50, density=(0.5, 0.5)),
}
BENCHMARK = ("mapf_3_agents", "mapf_4_agents", "mapf_5_agents")


OOD = ("ood_6_agents", "ood_dense")


def parse_ood(spec: str) -> tuple[str, ...]:
    """ "ood_6_agents,ood_dense" -> the names (each one of OOD); "" -> none."""
    return parse_names(spec, OOD, "ood")


def path(name: str) -> str:
    return os.path.join(DATA_DIR, f"{name}.jsonl")


def build(name: str, pool=None, progress: bool = False, sizes=None) -> list[dict]:
    """Generate the named set (certified), as a list of board dicts in file order; `sizes`
    builds only those cells (each cell has its own seed, so any cell can be rebuilt alone)."""
    from tqdm import tqdm

    from t2t_jax.env.certified import CertifiedGenerator

    spec = SETS[name]
    items = []
    for n in tqdm(sizes or spec.sizes, desc=name, disable=not progress):
        config = make_config(
            [{"size": n, "agents": spec.agents, "hole_density": list(spec.density)}], max_agents=spec.max_agents
        )
        gen = CertifiedGenerator(config, horizon=HORIZON, chunk=CHUNK, pool=pool)
        boards, plans = gen(jax.random.key(SEED + 100 * spec.agents + n), spec.boards)
        for item in io.boards_with_plans_to_json(boards, plans):
            item.pop("bucket")
            items.append(item)
    return items


def write(name: str, pool=None, progress: bool = True) -> str:
    """Regenerate the named set's file atomically; returns its path."""
    items = build(name, pool, progress)
    io.write_jsonl(path(name), items, sort_keys=True)
    return path(name)


def load(name: str) -> list[dict]:
    """The named set's boards (dicts with optimal_makespan, lower_bound and plan text)."""
    if name not in SETS:
        raise KeyError(f"unknown eval set {name!r}; known: {sorted(SETS)}")
    return io.read_jsonl(path(name))


def load_boards(name: str):
    """The named set as padded Boards (max_size 10, max_agents max(5, K))."""
    return io.boards_from_json(load(name), 10, SETS[name].max_agents)
