"""t2t_jax/distributed.py and what the stage loop shares between hosts, run as pods run it:
several processes over localhost (gloo), one device each."""

import json
import os
import subprocess
import sys

from conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hosts(script: str, n: int, out: str) -> list[list[str]]:
    """Run `tests/<script> PORT PID n OUT` as n processes; -> each process's lines."""
    port, env = free_port(), {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", script), str(port), str(i), str(n), out], env=env)
        for i in range(n)
    ]
    assert [p.wait(timeout=600) for p in procs] == [0] * n
    return [open(f"{out}.{i}").read().split("\n") for i in range(n)]


def test_two_hosts_deal_the_certification_and_hold_one_hosts_boards(tmp_path):
    """Each host certifies every other chunk (its solver work too); both hold the boards one
    process draws, in its order; a stop asked on one host stops both before the next round."""
    (one,) = hosts("boards_check.py", 1, str(tmp_path / "one"))
    two = hosts("boards_check.py", 2, str(tmp_path / "two"))
    assert one[1] == "not stopped" and [lines[1] for lines in two] == ["stopped", "stopped"]
    boards = json.loads(one[0])
    assert len(boards) == 70 and all("optimal_makespan" in b for b in boards)
    assert [json.loads(lines[0]) for lines in two] == [boards, boards]
