"""Bit-packed BFS against the plain-Python BFS and the dense baseline."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import generator

from t2t_jax.env import distances, io, reference
from t2t_jax.env.config import make_config

CONFIG = make_config([{"size": [3, 10], "agents": [1, 2], "hole_density": [0.0, 0.5]}])


def test_pack_roundtrip():
    mask = np.random.default_rng(0).random((7, 10, 10)) < 0.5
    np.testing.assert_array_equal(distances.unpack(distances.pack(jnp.asarray(mask)), 10), mask)


def test_distance_maps_match_reference_and_dense():
    boards = generator(CONFIG)(jax.random.key(0), 128)
    free = boards.free()
    sources = boards.goals[:, 0]
    ours = np.asarray(jax.jit(distances.distance_maps)(free, sources))
    dense = np.asarray(jax.jit(distances.distance_maps_dense)(free, sources))
    np.testing.assert_array_equal(ours, dense)
    for i, item in enumerate(io.boards_to_json(boards)):
        ref = reference.bfs(item, item["goals"][0])
        expect = np.full((10, 10), -1)
        for (r, c), d in ref.items():
            expect[r, c] = d
        np.testing.assert_array_equal(ours[i], expect)


def test_pair_distance_and_lower_bound():
    boards = generator(CONFIG)(jax.random.key(1), 64)
    rows = distances.pack(boards.free())
    d = np.asarray(distances.pair_distance(rows[:, None].repeat(5, 1), boards.starts, boards.goals))
    for i, item in enumerate(io.boards_to_json(boards)):
        for j, (s, g) in enumerate(zip(item["starts"], item["goals"])):
            assert d[i, j] == reference.bfs(item, s)[tuple(g)]


def test_unreachable_is_unknown():
    free = np.ones((1, 5, 5), bool)
    free[0, :, 2] = False
    d = distances.pair_distance(distances.pack(jnp.asarray(free)), jnp.array([[0, 0]]), jnp.array([[0, 4]]))
    assert int(d[0]) == -1
    maps = distances.distance_maps(jnp.asarray(free), jnp.array([[0, 0]]))
    assert int(maps[0, 0, 4]) == -1 and int(maps[0, 4, 1]) == 5


def test_components_and_flood():
    boards = generator(CONFIG)(jax.random.key(2), 64)
    labels = np.asarray(distances.components(boards.free()))
    rows = distances.pack(boards.free())
    seed = distances.cell_rows(boards.goals[:, 0], 10) & rows
    comp, ball = distances.flood(rows, seed, jnp.full((64,), 2))
    comp, ball = np.asarray(distances.unpack(comp, 10)), np.asarray(distances.unpack(ball, 10))
    for i, item in enumerate(io.boards_to_json(boards)):
        ref = reference.bfs(item, item["goals"][0])
        reach = np.zeros((10, 10), bool)
        near = np.zeros((10, 10), bool)
        for (r, c), d in ref.items():
            reach[r, c] = True
            near[r, c] = d <= 2
        np.testing.assert_array_equal(comp[i], reach)
        np.testing.assert_array_equal(ball[i], near)
        g = tuple(item["goals"][0])
        np.testing.assert_array_equal(labels[i] == labels[i][g], reach)
