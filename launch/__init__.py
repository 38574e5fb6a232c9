"""The command lines (`python -m launch.NAME`). Running one restarts it once, before its own module
loads, with glibc's huge-page malloc tunable on the CPU backend (t2t_jax/hostenv.py). For the
stage loop SIGTERM is blocked here, before any thread exists, and taken by one waiting thread
(t2t_jax/preemption.py `route_to_a_thread`), so a preemption signal never interrupts a
collective's or a storage client's thread."""

import signal

from t2t_jax import hostenv

hostenv.reexec_launcher()
if hostenv.launcher() == "launch.main":
    hostenv.block_signal(signal.SIGTERM)
