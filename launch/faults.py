"""Bad inputs, tried as a user would, and what each launcher did with them (issue 18's figures).

  python -m launch.faults [--areas=config,mapf,eval] [--fields=grpo.group_size,rollout.kv] [--out=faults.json]

Each case runs a launcher in a subprocess and is classed by its outcome:
- clean: a non-zero exit (2 for the launchers' own checks, 1 for absl's flag parser), no Python
  traceback, the last line of stderr names what was wrong
  (the config field, or `file:line: field` for a board file), and nothing written where the
  run would have written (its --workdir / --out absent);
- traceback: a Python traceback reached the terminal;
- accepted: exit 0, or still running at --timeout (the bad value was taken);
- unnamed: an error without a traceback whose last line does not name the culprit;
- wrote: refused, but something was left at --workdir / --out (data a user could mistake).

Areas:
- config: every field of the stage loop's schema (t2t_jax/config/schema.py) given a value of
  its own type that the schema refuses (the first of a few candidates it does refuse: -1, 0,
  nan, 2.0, "bogus", ...) to `launch.main --config=configs/stage.py`, and a few values of the
  wrong type that the flag parser refuses; fields that accept every value of their type (free
  text) have no case.
- mapf: a valid board line with one field broken at a time (wrong types, out-of-range sizes,
  positions outside the grid or on holes, shared starts or goals, truncated JSON), plus missing
  files and an unwritable --out, through `launch.mapf validate|show|solve`.
- eval: `launch.eval --run` at a missing directory, an empty one, and a bad --samples.

Prints a JSON line per case and a summary line per area ({"area", "cases", "clean",
"traceback", "accepted", "unnamed", "wrote"}); --out writes them all as one JSON file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("areas", ["config", "mapf", "eval"], "Which areas to try.")
flags.DEFINE_list("fields", [], "config: only these fields (default: every field with a bad value).")
flags.DEFINE_integer("timeout", 90, "Seconds a case may run before it counts as accepted.", lower_bound=1)
flags.DEFINE_string("out", None, "Write every case and the summaries to this JSON file.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTCOMES = ("clean", "traceback", "accepted", "unnamed", "wrote")
CANDIDATES = {  # by the default's type: tried in order, the first the schema refuses is the case
    int: (-1, 0, -5, 10**9),
    float: (-1.0, math.nan, 0.0, 2.0, 11.0, math.inf),
    str: ("bogus", "", "a,a"),
}
WRONG_TYPE = {"grpo.steps": "ten", "rollout.temperature": "hot", "train.share_prompts": "maybe"}


def run(args, timeout, cwd=ROOT) -> tuple[int | None, str]:
    """(exit code or None when it outran `timeout`, stdout + stderr)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}
    try:
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    return out.returncode, out.stdout + out.stderr


def classify(rc, output: str, names: tuple[str, ...], written: str | None) -> str:
    """One case's outcome (see the module docstring)."""
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if rc in (0, None):
        return "accepted"
    if written and os.path.exists(written) and (not os.path.isdir(written) or os.listdir(written)):
        return "wrote"
    last = _last(output)
    return "clean" if any(n in last for n in names) else "unnamed"


def _last(output: str) -> str:
    """The last line of `output` that is not start-up chatter ("" for none)."""
    lines = [line for line in output.splitlines() if line.strip() and not _noise(line)]
    return lines[-1] if lines else ""


def _noise(line: str) -> bool:
    """JAX / libtpu start-up chatter on stderr, and absl's hint after a flag error (not the message)."""
    if line.startswith("Pass --helpshort"):
        return True
    return line[:1] in "WIE" and line[1:5].isdigit() or "libtpu" in line or "TPU" in line or line.startswith("===")


def attempt(area: str, name: str, argv: list[str], names: tuple[str, ...], written: str | None) -> dict:
    """Run one case and class it: {"area", "case", "rc", "outcome", "last_line"}."""
    rc, output = run(argv, FLAGS.timeout)
    outcome = classify(rc, output, names, written)
    return {"area": area, "case": name, "rc": rc, "outcome": outcome, "last_line": _last(output)[:300]}


def bad_value(field: str, default, spec):
    """A value of `default`'s type that `spec` refuses (None: it accepts every one tried)."""
    from t2t_jax.config.schema import ConfigError

    kind = bool if isinstance(default, bool) else type(default) if default is not None else int
    for value in CANDIDATES.get(kind, ()):
        try:
            spec(field, value)
        except ConfigError:
            return value
    return None


def config_cases():
    """(name, argv, names the error must carry, where nothing may be written) for the config area."""
    from t2t_jax.config import defaults, schema

    base = schema.leaves(defaults.base().to_dict())
    specs = schema.fields()
    for field in FLAGS.fields or [f for f in specs if f != "mesh"]:
        spec = specs[field]
        value = bad_value(field, base.get(field), spec)
        if value is not None:
            yield field, f"--config.{field}={value}", (field,)
        if field in WRONG_TYPE:
            yield f"{field} (type)", f"--config.{field}={WRONG_TYPE[field]}", (field,)


def try_config(tmp):
    for i, (name, flag, names) in enumerate(config_cases()):
        workdir = os.path.join(tmp, f"config_{i}")
        argv = [sys.executable, "-m", "launch.main", "--config=configs/stage.py", flag, f"--workdir={workdir}"]
        yield {**attempt("config", name, argv, names, workdir), "flag": flag}


def mapf_cases(tmp):
    """(name, argv, names, written) for the mapf area, from one valid board and plan."""
    board = {"size": 4, "holes": [[1, 1]], "starts": [[0, 0], [3, 3]], "goals": [[0, 3], [3, 0]]}
    breaks = {
        "size as a string": {"size": "4"},
        "size as a bool": {"size": True},
        "size below 3": {"size": 2},
        "size above 31": {"size": 40},
        "start outside the grid": {"starts": [[0, 0], [4, 3]]},
        "start on a hole": {"starts": [[1, 1], [3, 3]]},
        "shared starts": {"starts": [[0, 0], [0, 0]]},
        "shared goals": {"goals": [[0, 3], [0, 3]]},
        "goals and starts of different counts": {"goals": [[0, 3]]},
        "a hole as a string": {"holes": ["1,1"]},
        "17 agents": {"starts": [[0, i % 4] for i in range(17)], "goals": [[3, i % 4] for i in range(17)]},
    }
    valid = os.path.join(tmp, "valid.jsonl")
    with open(valid, "w") as f:
        f.write(json.dumps(board) + "\n")
    plans = os.path.join(tmp, "plans.jsonl")
    with open(plans, "w") as f:
        f.write(json.dumps({"plan": "agent 1: R R R\nagent 2: L L L"}) + "\n")
    mapf = [sys.executable, "-m", "launch.mapf"]
    for i, (name, change) in enumerate(breaks.items()):
        path = os.path.join(tmp, f"board_{i}.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(board) + "\n" + json.dumps({**board, **change}) + "\n")
        for command in ("show", "validate"):
            extra = [f"--plans={plans}"] if command == "validate" else []
            yield f"{command}: {name}", mapf + [command, f"--boards={path}", *extra], (f"{path}:2",), None
    truncated = os.path.join(tmp, "truncated.jsonl")
    with open(truncated, "w") as f:
        f.write(json.dumps(board)[:-7] + "\n")
    yield (
        "validate: a truncated line",
        mapf + ["validate", f"--boards={truncated}", f"--plans={plans}"],
        (f"{truncated}:1",),
        None,
    )
    missing = os.path.join(tmp, "missing.jsonl")
    yield "show: a missing file", mapf + ["show", f"--boards={missing}"], (missing,), None
    yield (
        "validate: a missing plans file",
        mapf + ["validate", f"--boards={valid}", f"--plans={missing}"],
        (missing,),
        None,
    )
    out = os.path.join(tmp, "no_such_dir", "solved.jsonl")
    yield (
        "solve: --out in a missing directory",
        mapf + ["solve", f"--boards={valid}", f"--out={out}"],
        (os.path.dirname(out),),
        out,
    )
    shown = f"{tmp}/shown"
    yield "show: --out (it prints)", mapf + ["show", f"--boards={valid}", f"--out={shown}"], ("--out",), shown
    yield "generate: --num=0", mapf + ["generate", "--num=0", f"--out={tmp}/gen.jsonl"], ("num",), f"{tmp}/gen.jsonl"


def try_mapf(tmp):
    for name, argv, names, written in mapf_cases(tmp):
        yield attempt("mapf", name, argv, names, written)


def try_eval(tmp):
    empty = os.path.join(tmp, "empty_run")
    os.makedirs(empty, exist_ok=True)
    cases = {
        "--run at a missing directory": ([f"--run={tmp}/no_run"], ("no_run",)),
        "--run at an empty directory": ([f"--run={empty}"], ("empty_run",)),
        "--samples=-1": ([f"--run={empty}", "--samples=-1"], ("samples",)),
    }
    for name, (args, names) in cases.items():  # (a refusal must leave the empty run empty)
        yield attempt("eval", name, [sys.executable, "-m", "launch.eval", *args], names, empty)


AREAS = {"config": try_config, "mapf": try_mapf, "eval": try_eval}


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for area in dict.fromkeys(r["area"] for r in rows):
        mine = [r for r in rows if r["area"] == area]
        out.append({"area": area, "cases": len(mine), **{o: sum(r["outcome"] == o for r in mine) for o in OUTCOMES}})
    return out


def main(argv):
    del argv
    unknown = sorted(set(FLAGS.areas) - set(AREAS))
    if unknown:
        raise app.UsageError(f"--areas: {unknown} not among {sorted(AREAS)}")
    from t2t_jax.config import schema

    bad = sorted(set(FLAGS.fields) - set(schema.fields()))
    if bad:
        raise app.UsageError(f"--fields: {bad} are not config fields")
    if FLAGS.out and not os.path.isdir(os.path.dirname(os.path.abspath(FLAGS.out))):
        raise app.UsageError(f"--out: the directory of {FLAGS.out} does not exist")
    tmp = tempfile.mkdtemp(prefix="t2t_faults_")
    rows = []
    try:
        for area in FLAGS.areas:
            for row in AREAS[area](tmp):
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(rows)
    for line in summary:
        print(json.dumps(line), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump({"cases": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
