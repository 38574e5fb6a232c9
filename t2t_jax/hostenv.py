"""Process settings that must be in place before the interpreter starts: glibc's malloc tunables.

XLA:CPU allocates an executable's temporaries afresh on every call, and glibc serves each large
block with a new mmap, so every call page-faults its whole working set in 4 KiB pages.
`glibc.malloc.hugetlb=1` (glibc >= 2.35) makes malloc ask for transparent huge pages, which
removes almost all of those faults (measured: docs/experiments.md). Tunables are read once at
process start, so the launchers call `reexec_with_malloc_tunables()` before anything else and
restart themselves once with the tunable set; `T2T_JAX_REEXEC=0` turns that off (an older glibc ignores the tunable).
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"


def malloc_env(env=None) -> dict | None:
    """The environment to restart with (`env` plus the tunable), or None when it is already set,
    turned off, or not Linux."""
    env = dict(os.environ if env is None else env)
    current = env.get("GLIBC_TUNABLES", "")
    if env.get("T2T_JAX_REEXEC", "1") == "0" or not sys.platform.startswith("linux") or TUNABLE in current:
        return None
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [current, f"{TUNABLE}=1"]))
    return env


def reexec_with_malloc_tunables() -> None:
    """Replace this process by the same command line with the tunable set (no-op when set)."""
    env = malloc_env()
    if env is not None:
        sys.stdout.flush()
        os.execve(sys.executable, sys.orig_argv, env)
