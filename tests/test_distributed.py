"""t2t_jax/distributed.py and what the stage loop shares between hosts, run as pods run it:
several processes over localhost (gloo), one device each."""

import json
import os
import subprocess
import sys

import pytest
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


@pytest.mark.slow  # (48 s on an idle 2-core machine)
def test_two_hosts_deal_the_certification_and_hold_one_hosts_boards(tmp_path):
    """Each host certifies every other chunk (its solver work too); both hold the boards one
    process draws, in its order, and its counts of boards replaced; a stop asked on one host
    stops both before the next round."""
    (one,) = hosts("boards_check.py", 1, str(tmp_path / "one"))
    two = hosts("boards_check.py", 2, str(tmp_path / "two"))
    assert one[2] == "not stopped" and [lines[2] for lines in two] == ["stopped", "stopped"]
    boards, replaced = json.loads(one[0]), json.loads(one[1])
    assert len(boards) == 70 and all("optimal_makespan" in b for b in boards)
    assert [json.loads(lines[0]) for lines in two] == [boards, boards]
    # the counts of the chunks used, as one host counts them (not every chunk a round certified)
    generated = sum(c["generated"] for c in replaced.values())
    assert generated % 16 == 0 and 70 <= generated < 70 + 16 + sum(c["replaced"] for c in replaced.values())
    assert [json.loads(lines[1]) for lines in two] == [replaced, replaced]


def test_a_host_failing_alone_ends_every_host_in_bounded_time():
    """A failure on one host mid-run (launch.main: `distributed.exit_alone`) ends that process at
    once with its traceback, and its peer, waiting for it in a collective, is ended by the
    coordination service within the heartbeat timeout (10 s here; JAX's default is 100 s)."""
    port, env = free_port(), {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
    script = os.path.join(ROOT, "tests", "alone_check.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(port), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert procs[1].returncode == 1 and "RuntimeError: host 1 alone" in outs[1][1], outs[1][1][-2000:]
    assert procs[0].returncode != 0 and "host 0 went on" not in outs[0][0], outs[0][1][-2000:]
