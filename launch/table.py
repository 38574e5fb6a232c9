"""The paper's three tables (3/4/5 agents x map sizes, acc. and opt., Sum) merged from any results
files, with the paper's own rows beside them, 95% intervals per cell and on Sum, and paired tests
on Sum between rows scored on the same boards (t2t_jax/evaluation/table.py; docs/evaluation.md).

    python -m launch.table "Qwen3-4B (base)=eval_base" "GRPO (random)=runs/grpo_random" \
        "Ours=runs/ours" --out=table
    python -m launch.table base=eval_base/results_table.json ours=runs/ours/results.json#stage_3 \
        --paired=base:ours --nopaper

A row is [LABEL=]PATH[#POINT]: a results_table.json (launch.eval --out, or a run's last point), a
run's results.json (its last point, or POINT), or a directory holding either. Writes
table.{md,csv,json,png} under --out and prints their paths as JSON.
"""

import json

from absl import app, flags

from t2t_jax import cli
from t2t_jax.errors import UserError

_OUT = flags.DEFINE_string("out", "table", "Output directory (made if absent).")
_PAIRED = flags.DEFINE_string(
    "paired",
    "all",
    "Paired tests on Sum: all (every two rows on the same boards), none, or A:B,C:D (row labels; "
    "each pair must be on the same boards).",
)
_PAPER = flags.DEFINE_bool("paper", True, "The paper's published rows beside ours.")
_RESAMPLES = flags.DEFINE_integer(
    "resamples", 10000, "Bootstrap resamples of the Sum intervals.", lower_bound=100, upper_bound=1_000_000
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the bootstrap.", lower_bound=0, upper_bound=2**32 - 1)


def parse_pairs(spec: str):
    """--paired -> "all", "none" or [(label a, label b), ...]."""
    if spec in ("all", "none"):
        return spec
    pairs = [tuple(p.split(":")) for p in spec.split(",")]
    bad = [":".join(p) for p in pairs if len(p) != 2 or not all(p)]
    if bad:
        raise app.UsageError(f"--paired: {bad[0]!r} is not A:B (two row labels); or give all or none")
    return pairs


def main(argv):
    from t2t_jax.evaluation import table

    specs = argv[1:]
    if not specs:
        raise app.UsageError("give at least one results file: [LABEL=]PATH[#POINT]")
    pairs = parse_pairs(_PAIRED.value)
    cli.check_out(_OUT.value)
    rows = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        label, path = (label, path) if sep else ("", spec)
        if sep and not label:
            raise app.UsageError(f"{spec!r}: an empty label before '='")
        rows.append(table.load_row(path, label))
    try:
        merged = table.build(rows, paper=_PAPER.value, pairs=pairs, resamples=_RESAMPLES.value, seed=_SEED.value)
    except ValueError as e:
        raise UserError(str(e)) from None
    print(json.dumps(table.write(_OUT.value, merged)))


if __name__ == "__main__":
    cli.run(main)
