"""MAPF-FrozenLake from the command line.

  python -m launch.mapf generate --config=env.json --num=1000 --out=boards.jsonl [--seed=0]
  python -m launch.mapf validate --boards=boards.jsonl --plans=plans.jsonl
  python -m launch.mapf show --boards=boards.jsonl [--limit=5]
  python -m launch.mapf stats --config=env.json [--num=16384]

`--config` is a JSON file or inline JSON (see t2t_jax/env/config.py). A plans file has one JSON
object per line with a "text" field holding the plan text (`Agent 0: LEFT DOWN`), in the order
of the boards. `validate` prints one JSON verdict per line; `stats` one JSON object per bucket.
"""
from __future__ import annotations

import json
import sys

import jax
import numpy as np
from absl import app, flags
from tqdm import tqdm

from t2t_jax.env import io
from t2t_jax.env.config import ConfigError, load_config
from t2t_jax.env.generator import CORRIDORS, LINE, Generator
from t2t_jax.env.validator import validate

FLAGS = flags.FLAGS
flags.DEFINE_string("config", None, "EnvConfig: a JSON file or inline JSON.")
flags.DEFINE_integer("num", 1000, "Boards to generate.")
flags.DEFINE_integer("seed", 0, "PRNG seed.")
flags.DEFINE_integer("chunk", 4096, "Boards per jitted generator call.")
flags.DEFINE_string("out", None, "Output JSON-lines file (generate).")
flags.DEFINE_string("boards", None, "Boards JSON-lines file.")
flags.DEFINE_string("plans", None, "Plans JSON-lines file (validate).")
flags.DEFINE_integer("limit", 0, "Boards to show (0 = all).")
flags.DEFINE_integer("max_size", 10, "Padded grid side when reading boards.")
flags.DEFINE_integer("max_agents", 5, "Padded agent slots when reading boards.")

COMMANDS = ("generate", "validate", "show", "stats")


def _require(name):
    if getattr(FLAGS, name) is None:
        raise app.UsageError(f"--{name} is required for this command")
    return getattr(FLAGS, name)


def generate_boards(config, num: int, seed: int, chunk: int, progress: bool = True):
    """-> (list of board dicts, GenInfo source array [num]). Chunks of `chunk` boards, chunk i
    drawn with fold_in(key(seed), i)."""
    gen = Generator(config)
    chunk = min(chunk, num)
    key = jax.random.key(seed)
    boards, sources = [], []
    for i in tqdm(range(0, num, chunk), desc="generate", unit="chunk", disable=not progress):
        batch, info = gen.sample(jax.random.fold_in(key, i // chunk), chunk)
        take = min(chunk, num - i)
        boards.extend(io.boards_to_json(batch)[:take])
        sources.append(np.asarray(info.source)[:take])
    return boards, np.concatenate(sources) if sources else np.zeros(0, np.int32)


def _horizon(plans):
    longest = max([len(a) for p in plans for a in p if a is not None] + [1])
    return max(16, 1 << (longest - 1).bit_length())


def cmd_generate():
    config = load_config(_require("config"))
    out = _require("out")
    boards, _ = generate_boards(config, FLAGS.num, FLAGS.seed, FLAGS.chunk)
    io.write_jsonl(out, boards)
    print(json.dumps({"written": len(boards), "out": out}), file=sys.stderr)


def cmd_validate():
    items = io.read_jsonl(_require("boards"))
    plan_items = io.read_jsonl(_require("plans"))
    if len(plan_items) != len(items):
        raise app.UsageError(f"{len(items)} boards but {len(plan_items)} plans")
    boards = io.boards_from_json(items, FLAGS.max_size, FLAGS.max_agents)
    parsed = [io.parse_plan_text(p.get("text", ""), len(b["starts"])) for p, b in zip(plan_items, items)]
    plans = io.plans_from_lists([p for p, _, _ in parsed], FLAGS.max_agents,
                                _horizon([p for p, _, _ in parsed]),
                                statuses=[int(s) for _, s, _ in parsed],
                                unknown=[u for _, _, u in parsed])
    verdicts = validate(boards, plans)
    for i, item in enumerate(items):
        v = io.verdict_to_json(verdicts, i)
        v["goal_reached"] = v["goal_reached"][:len(item["starts"])]
        v["parse_status"] = parsed[i][1].name.lower()
        print(json.dumps(v))


def cmd_show():
    items = io.read_jsonl(_require("boards"))
    for i, item in enumerate(items[:FLAGS.limit or None]):
        extra = {k: item[k] for k in ("bucket", "lower_bound", "optimal_makespan") if k in item}
        print(f"# board {i} {json.dumps(extra)}\n{io.board_text(item)}\n")


def cmd_stats():
    config = load_config(_require("config"))
    boards, source = generate_boards(config, FLAGS.num, FLAGS.seed, FLAGS.chunk, progress=False)
    bucket = np.array([b["bucket"] for b in boards])
    for j, spec in enumerate(config.buckets):
        sel = bucket == j
        n = int(sel.sum())
        density = [len(b["holes"]) / b["size"] ** 2 for b, s in zip(boards, sel) if s]
        print(json.dumps({
            "bucket": j, "spec": spec.to_json(), "boards": n,
            "share": n / max(len(boards), 1),
            "first_candidate": float(np.mean(source[sel] == 0)) if n else None,
            "candidates": float(np.mean(source[sel] >= 0)) if n else None,
            "corridors": float(np.mean(source[sel] == CORRIDORS)) if n else None,
            "line": float(np.mean(source[sel] == LINE)) if n else None,
            "mean_density": float(np.mean(density)) if n else None,
            "mean_lower_bound": float(np.mean([b["lower_bound"] for b, s in zip(boards, sel) if s])) if n else None,
        }))


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"usage: python -m launch.mapf {{{'|'.join(COMMANDS)}}} [flags]")
    try:
        globals()[f"cmd_{argv[1]}"]()
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
