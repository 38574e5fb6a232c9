"""The launchers' restart with glibc's huge-page malloc tunable (t2t_jax/hostenv.py)."""

import os
import subprocess
import sys

from t2t_jax import hostenv

PRINT_TUNABLES = (
    "from t2t_jax import hostenv; hostenv.reexec_with_malloc_tunables(); "
    "import os; print(os.environ.get('GLIBC_TUNABLES', 'unset'))"
)


def test_malloc_env_adds_the_tunable_and_keeps_others():
    assert hostenv.malloc_env({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    env = hostenv.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "X": "1"}


def test_malloc_env_leaves_a_set_or_disabled_environment_alone():
    assert hostenv.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert hostenv.malloc_env({"T2T_JAX_REEXEC": "0"}) is None


def _child(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "T2T_JAX_REEXEC")}
    out = subprocess.run(
        [sys.executable, "-c", PRINT_TUNABLES],
        env=env | extra,
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    return out.stdout.strip()


def test_the_process_restarts_once_with_the_tunable():
    assert _child() == "glibc.malloc.hugetlb=1"
    assert _child(T2T_JAX_REEXEC="0") == "unset"
