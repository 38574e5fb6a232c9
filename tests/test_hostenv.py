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


def test_only_the_cpu_backend_restarts():
    assert hostenv.cpu_backend({"JAX_PLATFORMS": "cpu"}, device_files=("/dev/null",))
    assert not hostenv.cpu_backend({"JAX_PLATFORMS": "tpu,cpu"}, device_files=())
    assert not hostenv.cpu_backend({}, device_files=("/dev/null",))  # an accelerator's device file exists
    assert hostenv.cpu_backend({}, device_files=("/dev/no-such-accelerator*",))
    assert hostenv.malloc_env({"JAX_PLATFORMS": "cuda"}) is None


def test_a_launcher_is_recognised_from_the_command_line():
    assert hostenv.launcher(["python", "-m", "launch.main", "--config=x"]) == "launch.main"
    assert hostenv.launcher(["python", "-u", "-m", "launch.eval"]) == "launch.eval"
    assert hostenv.launcher(["python", "-m", "pytest", "-q"]) is None
    assert hostenv.launcher(["python", "script.py", "-m", "launch.main"]) is None
    assert hostenv.launcher(["python"]) is None


def test_running_a_launcher_restarts_it_with_the_tunable(tmp_path):
    """`python -m launch.NAME` restarts through launch/__init__.py before the module runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "T2T_JAX_REEXEC")}
    root = os.path.dirname(os.path.dirname(__file__))
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "__init__.py").write_text(open(os.path.join(root, "launch", "__init__.py")).read())
    (tmp_path / "launch" / "probe.py").write_text("import os\nprint(os.environ.get('GLIBC_TUNABLES', 'unset'))\n")
    run = lambda **extra: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "launch.probe"],
        env=env | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": root} | extra,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert run() == "glibc.malloc.hugetlb=1"
    assert run(JAX_PLATFORMS="tpu") == "unset"
