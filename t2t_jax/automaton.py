"""Token automata as host tables, from an outlines-core `Index` (numpy only: the server builds
them in a worker process that must not load JAX; sampling/constrained.py puts them on the device).
"""

from __future__ import annotations

import numpy as np


def index_tables(index, eos: int, check=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """An outlines-core Index as host tables: (tokens [S, W] (-1 pads), next [S, W], final [S],
    the initial state's number). `check(states, width)`, when given, runs before the tables are
    filled and may raise (a server's bound on their size)."""
    transitions = index.get_transitions()
    states = sorted(set(transitions) | set(index.get_final_states()) | {index.get_initial_state()})
    width = max([1] + [len(t) for t in transitions.values()])
    if check is not None:
        check(len(states), width)
    number = {s: i for i, s in enumerate(states)}
    tokens = np.full((len(states), width), -1, np.int32)
    nxt = np.zeros((len(states), width), np.int32)
    for s, row in transitions.items():
        items = sorted((tok, dst) for tok, dst in row.items() if tok != eos)
        tokens[number[s], : len(items)] = [t for t, _ in items]
        nxt[number[s], : len(items)] = [number[d] for _, d in items]
    final = np.array([index.is_final_state(s) for s in states], bool)
    return tokens, nxt, final, number[index.get_initial_state()]
