"""The command lines (`python -m launch.NAME`). Running one restarts it once, before its own module
loads, with glibc's huge-page malloc tunable on the CPU backend (t2t_jax/hostenv.py)."""

from t2t_jax import hostenv

hostenv.reexec_launcher()
