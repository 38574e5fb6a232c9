"""Shared test helpers: hypothesis profile and small board factories."""

import functools
import os
import socket

import numpy as np
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "ci", deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def make_board(size, holes=(), starts=(), goals=(), optimal_makespan=None):
    """An interchange dict (see t2t_jax.env.io)."""
    board = {
        "size": size,
        "holes": [list(h) for h in holes],
        "starts": [list(s) for s in starts],
        "goals": [list(g) for g in goals],
    }
    if optimal_makespan is not None:
        board["optimal_makespan"] = optimal_makespan
    return board


def free_cells(board):
    holes = {tuple(h) for h in board["holes"]}
    n = board["size"]
    return [(r, c) for r in range(n) for c in range(n) if (r, c) not in holes]


def as_numpy(tree):
    return {k: np.asarray(v) for k, v in tree.items()}


@functools.cache
def generator(config, candidates=8):
    """One compiled Generator per (config, candidates) for the whole session."""
    from t2t_jax.env.generator import Generator

    return Generator(config, candidates=candidates)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (servers, coordinators and emulators of the tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
