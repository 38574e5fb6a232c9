"""Process settings that must be in place before the interpreter starts: glibc's malloc tunables.

XLA:CPU allocates an executable's temporaries afresh on every call, and glibc serves each large
block with a new mmap, so every call page-faults its whole working set in 4 KiB pages.
`glibc.malloc.hugetlb=1` (glibc >= 2.35) makes malloc ask for transparent huge pages, which
removes almost all of those faults (measured: docs/experiments.md). Tunables are read once at
process start, so a launcher (`python -m launch.X`) restarts itself once with the tunable set
before anything else: `launch/__init__.py` calls `reexec_launcher()`, which runs before the
launcher's own module. Only for the CPU backend: with an accelerator (a TPU or NVIDIA device
file, or JAX_PLATFORMS naming another platform first) the host's allocations are not the hot
path and the process is left alone. `T2T_JAX_REEXEC=0` turns it off (an older glibc ignores the
tunable).
"""

from __future__ import annotations

import glob
import os
import sys

TUNABLE = "glibc.malloc.hugetlb"


ACCELERATOR_FILES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")  # TPU (v4/v5e; v5p/v6e), NVIDIA


def cpu_backend(env=None, device_files=ACCELERATOR_FILES) -> bool:
    """Whether JAX will compute on the CPU: JAX_PLATFORMS names cpu first, or it is unset and no
    accelerator's device file exists (judged without importing jax)."""
    env = os.environ if env is None else env
    platforms = [p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms:
        return platforms[0] == "cpu"
    return not any(glob.glob(pattern) for pattern in device_files)


def malloc_env(env=None) -> dict | None:
    """The environment to restart with (`env` plus the tunable), or None when it is already set,
    turned off, not Linux, or JAX will not compute on the CPU."""
    env = dict(os.environ if env is None else env)
    current = env.get("GLIBC_TUNABLES", "")
    off = env.get("T2T_JAX_REEXEC", "1") == "0" or not sys.platform.startswith("linux")
    if off or TUNABLE in current or not cpu_backend(env):
        return None
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [current, f"{TUNABLE}=1"]))
    return env


def reexec_with_malloc_tunables() -> None:
    """Replace this process by the same command line with the tunable set (no-op when set)."""
    env = malloc_env()
    if env is not None:
        sys.stdout.flush()
        os.execve(sys.executable, sys.orig_argv, env)


def launcher(argv=None) -> str | None:
    """The launcher this process runs (`python [opts] -m launch.NAME ...` -> "launch.NAME"), or None."""
    argv = list(sys.orig_argv if argv is None else argv)
    for i, arg in enumerate(argv[1:-1], 1):
        if arg == "-m":
            return argv[i + 1] if argv[i + 1].startswith("launch.") else None
        if not arg.startswith("-"):
            return None
    return None


def reexec_launcher() -> None:
    """`reexec_with_malloc_tunables()` when this process runs a launcher (`launch/__init__.py`)."""
    if launcher() is not None:
        reexec_with_malloc_tunables()


def block_signal(signum: int) -> None:
    """Block `signum` in this thread, and so in every thread started after (before numpy's or
    XLA's thread pools exist): `preemption.route_to_a_thread` then takes it in one waiting thread."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
