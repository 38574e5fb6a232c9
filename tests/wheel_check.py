"""The installed wheel, checked from outside the repository (.ci/run): every module of t2t_jax
imports from site-packages, its data files are there, and the repository's own `launch` and
`configs` are not installed.

    cd /tmp && VENV/bin/python REPO/tests/wheel_check.py
"""

import importlib
import importlib.util
import os
import pkgutil
import sys


def main() -> None:
    sys.path = [p for p in sys.path if p not in ("", os.getcwd(), os.path.dirname(os.path.abspath(__file__)))]
    import t2t_jax

    root = os.path.dirname(t2t_jax.__file__)
    if "site-packages" not in root:
        raise SystemExit(f"t2t_jax imported from {root}, not from an installed wheel")
    names = [m.name for m in pkgutil.walk_packages(t2t_jax.__path__, "t2t_jax.")]
    for name in names:
        importlib.import_module(name)  # a subpackage missing from the wheel fails here
    for top in ("launch", "configs"):
        if importlib.util.find_spec(top) is not None:
            raise SystemExit(f"the wheel installs a top-level package {top!r}")

    from t2t_jax.config import defaults, schema
    from t2t_jax.evaluation import sets
    from t2t_jax.text import tokenizer

    schema.validate(defaults.base())
    boards = sets.load("mapf_3_agents")
    tok = tokenizer.load_tokenizer()
    assert len(boards) > 0 and tok("Agent 0: UP")["input_ids"], "data files missing from the wheel"
    print(f"wheel ok: {len(names)} modules from {root}, {len(boards)} boards in mapf_3_agents")


if __name__ == "__main__":
    main()
