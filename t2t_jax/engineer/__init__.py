"""The environment engineer: the failure account (context.py), the proposal's parsing and checks
(propose.py), the baselines (baselines.py) and the `Engineer` that picks among them (engineer.py)."""
