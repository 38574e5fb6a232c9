"""MAPF-FrozenLake from the command line.

  python -m launch.mapf generate --config=env.json --num=1000 --out=boards.jsonl [--seed=0]
  python -m launch.mapf validate --boards=boards.jsonl --plans=plans.jsonl
  python -m launch.mapf show --boards=boards.jsonl [--limit=5]
  python -m launch.mapf stats --config=env.json [--num=16384]
  python -m launch.mapf solve --boards=boards.jsonl        # exact optimum + witness per board
  python -m launch.mapf build_sets [--sets=mapf_3_agents,...]   # regenerate the eval sets
  python -m launch.mapf render --boards=boards.jsonl [--plans=plans.jsonl] --out=DIR

`--config` is a JSON file or inline JSON (see t2t_jax/env/config.py). A plans file has one JSON
object per line with a "text" field holding the plan text (`Agent 0: LEFT DOWN`), in the order
of the boards (optionally `"truncated": true`), read by t2t_jax.text.parsing. `validate` prints one JSON verdict
per line; `stats` one JSON object per bucket; `solve` one JSON object per board with
`optimal_makespan`, `lower_bound` and `plan`.
`generate` certifies every board (optimal_makespan and the witness `plan`) unless
`--certify=false`; infeasible boards are replaced.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import tempfile

import jax
import numpy as np
from absl import app, flags
from tqdm import tqdm

from t2t_jax import cli
from t2t_jax.env import io, solver
from t2t_jax.env.certified import CertifiedGenerator
from t2t_jax.env.config import ConfigError, EnvConfig
from t2t_jax.env.generator import CORRIDORS, LINE, Generator
from t2t_jax.env.types import ParseStatus
from t2t_jax.env.validator import validate
from t2t_jax.evaluation.sets import SETS
from t2t_jax.evaluation.sets import write as write_set
from t2t_jax.text.parsing import MAX_LINE, parse_completions

FLAGS = flags.FLAGS
flags.DEFINE_string("config", None, "EnvConfig: a JSON file or inline JSON.")
flags.DEFINE_integer("num", 1000, "Boards to generate.", lower_bound=1, upper_bound=10_000_000)
flags.DEFINE_integer("seed", 0, "PRNG seed.", lower_bound=0, upper_bound=2**32 - 1)
flags.DEFINE_integer("chunk", 4096, "Boards per jitted generator call.", lower_bound=1, upper_bound=65536)
flags.DEFINE_string("out", None, "Output JSON-lines file (generate).")
flags.DEFINE_string("boards", None, "Boards JSON-lines file.")
flags.DEFINE_string("plans", None, "Plans JSON-lines file (validate).")
flags.DEFINE_integer("limit", 0, "Boards to show (0 = all).", lower_bound=0, upper_bound=10**9)
flags.DEFINE_integer("max_size", 10, "Padded grid side when reading boards.", lower_bound=3, upper_bound=31)
flags.DEFINE_integer("max_agents", 5, "Padded agent slots when reading boards.", lower_bound=1, upper_bound=16)
flags.DEFINE_bool("certify", True, "generate: certify optimal makespans (and drop infeasible boards).")
flags.DEFINE_integer("horizon", 64, "Longest plan searched when certifying / solving.", lower_bound=1, upper_bound=1024)
flags.DEFINE_integer("workers", 0, "Solver processes (0 = one per CPU).", lower_bound=0, upper_bound=256)
flags.DEFINE_list("sets", list(SETS), "build_sets: which eval sets.")
cli.one_of("sets", SETS)

flags.DEFINE_integer("cell", 40, "render: pixels per cell.", lower_bound=4, upper_bound=200)

COMMANDS = ("generate", "validate", "show", "stats", "solve", "build_sets", "render")
WRITES_OUT = ("generate", "solve", "render")  # the commands that take --out


def _require(name):
    if getattr(FLAGS, name) is None:
        raise app.UsageError(f"--{name} is required for this command")
    return getattr(FLAGS, name)


def _writable_out(directory: bool = False) -> str:
    """--out, checked before any work: a file in an existing writable directory (not a directory
    itself), or with `directory` a directory that exists or can be made, writable."""
    out = _require("out")
    parent = out if directory else os.path.dirname(os.path.abspath(out))
    if not directory and os.path.isdir(out):
        raise app.UsageError(f"--out: {out!r} is a directory; give a file path")
    if directory and os.path.exists(out) and not os.path.isdir(out):
        raise app.UsageError(f"--out: {out!r} is a file; give a directory")
    while directory and not os.path.exists(parent):  # the nearest existing ancestor must be writable
        parent = os.path.dirname(os.path.abspath(parent))
    if not os.path.isdir(parent):
        raise app.UsageError(f"--out: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise app.UsageError(f"--out: directory {parent!r} is not writable")
    return out


MAX_CONFIG_BYTES = 1 << 20


def _env_config():
    """--config (a JSON file or inline JSON), read strictly: bounded JSON (t2t_jax/env/io.py's
    `loads_bounded`), every value a number or a [low, high] pair of numbers (a size of "4" is
    refused, not converted), then the EnvConfig's own ranges. Errors name --config's file and
    the field."""
    spec = _require("config")
    where, text = "--config", spec
    inline = spec.lstrip().startswith("{") or spec.lstrip()[:1] in ("[", '"') and not os.path.exists(spec)
    if not inline:
        where = spec
        if os.path.isdir(spec):
            raise ConfigError(f"--config: {spec} is a directory; give a JSON file or inline JSON")
        with open(spec, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{spec}: larger than {MAX_CONFIG_BYTES} bytes; not an environment config")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{spec}: not UTF-8 text (byte {e.start + 1})") from None
    data = io.loads_bounded(text, where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
    _numbers_only(data, where, "")
    try:
        return EnvConfig.from_json(data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _numbers_only(node, where: str, path: str) -> None:
    """Every leaf of an environment config is a number (not a string, a boolean or null)."""
    if isinstance(node, dict):
        for key, value in node.items():
            _numbers_only(value, where, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _numbers_only(value, where, f"{path}[{i}]")
    elif isinstance(node, io.BigNumber):
        raise ConfigError(f"{where}: {path}: {node!r} is out of range")
    elif isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ConfigError(f"{where}: {path}: {node!r} is not a number")
    elif not math.isfinite(node):
        raise ConfigError(f"{where}: {path}: {node!r} is not a finite number")


def _boards():
    """--boards, read and every board checked (errors name file:line: field)."""
    return io.read_boards(_require("boards"), FLAGS.max_size, FLAGS.max_agents)


def _plans(boards: int) -> list[dict]:
    """--plans, read and checked: one plan per board of --boards, in their order."""
    plan_items = io.read_plans(_require("plans"))
    if len(plan_items) != boards:
        raise app.UsageError(
            f"--plans: {FLAGS.plans} holds {len(plan_items)} plans for the {boards} boards of {FLAGS.boards}; "
            "give one plan per board, in the boards' order"
        )
    return plan_items


def _plan_horizon(texts) -> int:
    """Plan slots for the validator: the most actions any plan line can hold (lines are cut at
    the parser's MAX_LINE), rounded up to a power of two, at least 16: never more than about
    MAX_LINE / 2, whatever the file."""
    words = max((len(line[:MAX_LINE].split()) for t in texts for line in t.splitlines()), default=1)
    return max(16, 1 << max(words, 1).bit_length())


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


def certified_boards(config, num: int, seed: int, chunk: int) -> list[dict]:
    """Board dicts with optimal_makespan, lower_bound and the witness `plan` text."""
    with solver.make_pool(FLAGS.workers or None) as pool:
        gen = CertifiedGenerator(config, horizon=FLAGS.horizon, chunk=min(chunk, max(num, 64)), pool=pool)
        boards, plans = gen(jax.random.key(seed), num)
    print(json.dumps(gen.last_stats.as_dict()), file=sys.stderr)
    return io.boards_with_plans_to_json(boards, plans)


def cmd_generate():
    config = _env_config()
    out = _writable_out()
    if FLAGS.certify:
        boards = certified_boards(config, FLAGS.num, FLAGS.seed, FLAGS.chunk)
    else:
        boards, _ = generate_boards(config, FLAGS.num, FLAGS.seed, FLAGS.chunk)
    io.write_jsonl(out, boards)
    print(json.dumps({"written": len(boards), "out": out}), file=sys.stderr)


def cmd_solve():
    """One JSON line per board (its optimal makespan, lower bound, plan, seconds) to --out, or to
    stdout without it."""
    out = _writable_out() if FLAGS.out else None
    items, _ = _boards()
    with solver.make_pool(FLAGS.workers or None) as pool, tqdm(total=len(items), desc="solve", unit="board") as bar:
        solutions = solver.solve_many([(b, None) for b in items], pool, max_makespan=FLAGS.horizon, on_done=bar.update)
    lines = [
        json.dumps(
            {
                "optimal_makespan": sol.optimal_makespan,
                "lower_bound": sol.lower_bound,
                "plan": io.plan_to_text(sol.plan) if sol.plan is not None else None,
                "seconds": round(sol.seconds, 4),
            }
        )
        for sol in solutions
    ]
    if out is None:
        print("\n".join(lines))
    else:
        io.write_atomic(out, (line + "\n" for line in lines))


def cmd_build_sets():
    with solver.make_pool(FLAGS.workers or None) as pool:
        for name in FLAGS.sets:
            if name not in SETS:
                raise app.UsageError(f"unknown set {name!r}; known: {sorted(SETS)}")
            print(json.dumps({"written": write_set(name, pool)}), file=sys.stderr)


VALIDATE_CHUNK = 1024  # boards per validator call: memory stays bounded whatever the file holds


def cmd_validate():
    """One JSON verdict per board, in chunks of VALIDATE_CHUNK boards, each with the plan slots
    its own longest line needs (at most [chunk, agents, ~MAX_LINE / 2] actions in memory)."""
    items, boards = _boards()
    plan_items = _plans(len(items))
    for start in range(0, len(items), VALIDATE_CHUNK):
        part = slice(start, start + VALIDATE_CHUNK)
        texts = [p.get("text", "") for p in plan_items[part]]
        num_agents = [len(b["starts"]) for b in items[part]]
        truncated = [p.get("truncated", False) for p in plan_items[part]]
        plans = parse_completions(texts, num_agents, FLAGS.max_agents, _plan_horizon(texts), truncated=truncated)
        verdicts = validate(jax.tree.map(lambda x: x[part], boards), plans)
        for i, agents in enumerate(num_agents):
            v = io.verdict_to_json(verdicts, i)
            v["goal_reached"] = v["goal_reached"][:agents]
            v["parse_status"] = ParseStatus(int(plans.parse_status[i])).name.lower()
            print(json.dumps(v))


def cmd_show():
    items, _ = _boards()
    for i, item in enumerate(items[: FLAGS.limit or None]):
        extra = {k: item[k] for k in ("bucket", "lower_bound", "optimal_makespan") if k in item}
        print(f"# board {i} {json.dumps(extra)}\n{io.board_text(item)}\n")


def cmd_stats():
    config = _env_config()
    boards, source = generate_boards(config, FLAGS.num, FLAGS.seed, FLAGS.chunk, progress=False)
    bucket = np.array([b["bucket"] for b in boards])
    for j, spec in enumerate(config.buckets):
        sel = bucket == j
        n = int(sel.sum())
        density = [len(b["holes"]) / b["size"] ** 2 for b, s in zip(boards, sel) if s]
        print(
            json.dumps(
                {
                    "bucket": j,
                    "spec": spec.to_json(),
                    "boards": n,
                    "share": n / max(len(boards), 1),
                    "first_candidate": float(np.mean(source[sel] == 0)) if n else None,
                    "candidates": float(np.mean(source[sel] >= 0)) if n else None,
                    "corridors": float(np.mean(source[sel] == CORRIDORS)) if n else None,
                    "line": float(np.mean(source[sel] == LINE)) if n else None,
                    "mean_density": float(np.mean(density)) if n else None,
                    "mean_lower_bound": float(np.mean([b["lower_bound"] for b, s in zip(boards, sel) if s]))
                    if n
                    else None,
                }
            )
        )


def cmd_render():
    """board_i.png per board, plan_i.gif per plan (from --plans, else the boards' own `plan`
    witness when they carry one), and grid.png of the first 16 boards. Everything is checked,
    then drawn into a temporary directory beside --out and moved in only when all of it is drawn:
    a refusal or a failure leaves --out as it was."""
    from t2t_jax.render import board_image, boards_grid, save_gif
    from t2t_jax.text.parsing import parse_completion

    out = _writable_out(directory=True)
    items = _boards()[0]
    texts = [p.get("text", "") for p in _plans(len(items))] if FLAGS.plans else [b.get("plan") for b in items]
    items = items[: FLAGS.limit or None]
    made = _missing_dirs(out)
    for d in reversed(made):
        os.mkdir(d)
    tmp = tempfile.mkdtemp(prefix=".render_", dir=out)
    try:
        for i, board in enumerate(items):
            board_image(board, FLAGS.cell).save(os.path.join(tmp, f"board_{i}.png"))
            if i < len(texts) and texts[i]:
                plan, _ = parse_completion(texts[i], len(board["starts"]), 4 * FLAGS.horizon)
                save_gif(board, plan, os.path.join(tmp, f"plan_{i}.gif"), FLAGS.cell)
        boards_grid(items[:16]).save(os.path.join(tmp, "grid.png"))
        for name in sorted(os.listdir(tmp)):
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in made:  # (the directories this command made, deepest first, if still empty)
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise
    os.rmdir(tmp)
    print(json.dumps({"rendered": len(items), "out": out}), file=sys.stderr)


def _missing_dirs(path: str) -> list[str]:
    """`path` and its ancestors that do not exist yet, deepest first."""
    out = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        out.append(path)
        path = os.path.dirname(path)
    return out


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"usage: python -m launch.mapf {{{'|'.join(COMMANDS)}}} [flags]")
    if FLAGS.out and argv[1] not in WRITES_OUT:  # (a flag the command would ignore)
        raise app.UsageError(f"--out: {argv[1]} prints to stdout (redirect it); --out is for {', '.join(WRITES_OUT)}")
    try:
        globals()[f"cmd_{argv[1]}"]()
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli.run(main)
