"""Generator: every board respects its bucket; mixtures, determinism, one compilation."""

import jax
import numpy as np
import pytest
from conftest import generator

from t2t_jax.env import io, reference
from t2t_jax.env.config import hole_count, make_config
from t2t_jax.env.generator import CORRIDORS, LINE, Generator
from t2t_jax.env.validator import validate

MIXED = make_config(
    [
        {"size": [3, 5], "agents": [2, 3], "hole_density": [0.0, 0.5], "weight": 1.0},
        {"size": [6, 10], "agents": [2, 5], "hole_density": [0.2, 0.5], "min_distance": 3, "weight": 2.0},
        {"size": 10, "agents": 5, "hole_density": 0.5, "min_distance": 8, "weight": 1.0},
    ]
)


def check_boards(config, boards, info=None):
    """Every contract property of generated boards, against the plain-Python BFS."""
    items = io.boards_to_json(boards)
    density = np.asarray(info.density) if info is not None else None
    for i, item in enumerate(items):
        bucket = config.buckets[item["bucket"]]
        n, k = item["size"], len(item["starts"])
        assert bucket.size[0] <= n <= bucket.size[1]
        assert bucket.agents[0] <= k <= bucket.agents[1]
        if density is not None:
            assert bucket.hole_density[0] <= density[i] <= bucket.hole_density[1] + 1e-6
            assert len(item["holes"]) == int(hole_count(density[i], n))
        lo = int(hole_count(bucket.hole_density[0], n))
        hi = int(hole_count(bucket.hole_density[1], n))
        assert lo <= len(item["holes"]) <= hi
        starts = [tuple(s) for s in item["starts"]]
        goals = [tuple(g) for g in item["goals"]]
        holes = {tuple(h) for h in item["holes"]}
        assert len(set(starts)) == k and len(set(goals)) == k
        assert not holes & (set(starts) | set(goals))
        assert all(0 <= v < n for cell in starts + goals for v in cell)
        dists = [reference.bfs(item, g).get(s) for s, g in zip(starts, goals)]
        assert all(d is not None and d >= bucket.min_distance for d in dists), (item, dists)
        assert item["lower_bound"] == max(dists)
    # Padding is clean: nothing outside the grid, padded slots empty.
    holes = np.asarray(boards.holes)
    sizes = np.asarray(boards.size)
    idx = np.arange(holes.shape[-1])
    outside = (idx[None, :, None] >= sizes[:, None, None]) | (idx[None, None, :] >= sizes[:, None, None])
    assert not (holes & outside).any()
    mask = np.asarray(boards.agent_mask)
    assert (np.asarray(boards.starts)[~mask] == 0).all()


def test_mixed_batch_respects_buckets():
    gen = generator(MIXED)
    boards, info = gen.sample(jax.random.key(0), 1024)
    check_boards(MIXED, boards, info)
    sources = set(np.asarray(info.source).tolist())
    assert 0 in sources and CORRIDORS in sources  # the dense bucket needs the corridors tier


def test_mixture_follows_weights():
    boards = generator(MIXED)(jax.random.key(1), 4096)
    counts = np.bincount(np.asarray(boards.bucket), minlength=3)
    expected = MIXED.weights * 4096
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 13.8  # p = 0.001 for 2 degrees of freedom


def test_sizes_and_agents_cover_their_ranges():
    config = make_config([{"size": [3, 6], "agents": [1, 3], "hole_density": [0.0, 0.3]}])
    boards = generator(config)(jax.random.key(2), 2048)
    assert set(np.asarray(boards.size).tolist()) == {3, 4, 5, 6}
    assert set(np.asarray(boards.num_agents).tolist()) == {1, 2, 3}


def test_deterministic_per_key():
    gen = generator(MIXED)
    a = gen(jax.random.key(3), 64)
    b = Generator(MIXED)(jax.random.key(3), 64)
    c = gen(jax.random.key(4), 64)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.holes, c.holes)


def test_one_compilation_for_mixed_batches():
    """Mixed sizes and agent counts share one compiled call, and so do configs of the same
    bucket count and padding."""
    from t2t_jax.env import generator as G

    other = make_config(
        [
            {"size": [4, 9], "agents": [1, 4], "hole_density": [0.1, 0.2]},
            {"size": 3, "agents": 2, "hole_density": 0.0},
            {"size": [6, 10], "agents": 5, "hole_density": 0.4, "min_distance": 2},
        ]
    )
    generator(MIXED)(jax.random.key(0), 128)
    before = G.sample._cache_size()
    for seed, config in enumerate([MIXED, other, MIXED]):
        boards = Generator(config)(jax.random.key(seed), 128)
        assert len(set(np.asarray(boards.size).tolist())) > 3
    assert G.sample._cache_size() == before


@pytest.mark.parametrize("candidates", [0, 1])
def test_fallback_tiers_are_legal(candidates):
    """With no candidates the corridors tier (and, where it fails, the line) makes every board."""
    config = make_config(
        [
            {"size": [3, 4], "agents": [2, 3], "hole_density": 0.5, "min_distance": 1},
            {"size": [6, 10], "agents": [3, 5], "hole_density": [0.3, 0.5], "min_distance": 4},
        ]
    )
    boards, info = generator(config, candidates).sample(jax.random.key(5), 512)
    check_boards(config, boards, info)
    assert {CORRIDORS, LINE} <= set(np.asarray(info.source).tolist())


def test_line_boards_have_their_walk_forward_plan():
    """The line tier's joint plan (everyone walks forward min_distance steps) is valid."""
    config = make_config([{"size": 3, "agents": 3, "hole_density": 0.5, "min_distance": 1}])
    boards, info = generator(config, 0).sample(jax.random.key(6), 256)
    line = np.flatnonzero(np.asarray(info.source) == LINE)
    assert len(line) > 0
    items = [io.board_to_json(boards, int(i)) for i in line]
    plans = []
    for item in items:
        agents = []
        for s, g in zip(item["starts"], item["goals"]):
            # At min_distance 1 each goal is the next cell of the line: one step forward.
            (r, c), (gr, gc) = s, g
            agents.append([{(1, 0): "DOWN", (-1, 0): "UP", (0, 1): "RIGHT", (0, -1): "LEFT"}[(gr - r, gc - c)]])
        plans.append(agents)
    v = validate(io.boards_from_json(items, 10, 5), io.plans_from_lists(plans, 5, 4))
    assert np.asarray(v.valid).all() and (np.asarray(v.makespan) == 1).all()
