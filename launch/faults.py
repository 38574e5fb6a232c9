"""Bad inputs, tried as a user would, and what each launcher did with them (issues 18 and 31).

  python -m launch.faults [--areas=config,overrides,flags,mapf,eval,eval_runs] [--fields=grpo.steps,...]
      [--launchers=mapf,eval,...] [--out=faults.json]

Each case runs a launcher in a subprocess and is classed by its outcome:
- clean: a non-zero exit, no Python traceback, the last line of stderr names what was wrong
  (the flag or config field, or `file:line: field` for a board file), and nothing written where
  the run would have written (its --workdir / --out absent or left as it was);
- traceback: a Python traceback reached the terminal;
- accepted: exit 0, or still running at --timeout (the bad value was taken);
- unnamed: an error without a traceback whose last line does not name the culprit;
- wrote: refused, but something was left at --workdir / --out (data a user could mistake).

Areas (`AREAS`: name -> a function of a scratch directory yielding `Case`s; add one with `@area`):
- config: every field of the stage loop's schema (t2t_jax/config/schema.py) given a value of
  its own type that the schema refuses (the first of a few candidates it does refuse: -1, 0,
  nan, 2.0, "bogus", ...) to `launch.main --config=configs/stage.py`, and a few values of the
  wrong type that the flag parser refuses; fields that accept every value of their type (free
  text) have no case.
- overrides: the config file and its overrides mistyped: an unknown field, section or mesh axis,
  an override inside a field, a missing file, a directory, a file that is no config, a syntax
  error, an argument the config refuses; through `launch.main`, `launch.study` and `launch.aot`.
- flags: every flag of every launcher (read from its `--helpxml`; --launchers picks some) given
  a value absl must refuse: of the wrong type, non-finite, huge (10**30), below or above its
  declared bounds, and zero and -1 where it declares none; plus named bad values of the list and
  text flags (`FLAG_CASES`).
- mapf: board, plan and environment-config files broken one way at a time: wrong types,
  out-of-range sizes, positions off the grid or on holes, shared starts or goals, integers past
  int32/int64 and of thousands of digits, NaN, JSON nested thousands deep, truncated lines, empty
  files, binary garbage, over-long lines, plan counts that differ from the board count; missing
  files and an unwritable --out; through `launch.mapf validate|show|solve|render|generate|stats`
  (render and generate must leave their --out untouched).
- eval: `launch.eval --run` at a missing directory and an empty one, and a bad --samples.
- eval_runs: `launch.eval --run` at a run whose config.json or newest checkpoint's records (its
  checksums, the run's JSON record) are missing, empty, binary, nested thousands deep or do not
  match; an --hf directory with no checkpoint; an --out that is a file.

- serve, client: hostile requests to a `launch.serve --tiny` started on 127.0.0.1, and the API
  client against misbehaving servers and broken cache files (launch/faults_serving.py: its
  cases yield finished rows, in these outcomes).

Not swept: checkpoints damaged under a running `launch.main`, its lock, signals (their tests:
docs/reliability.md).

Prints a JSON line per case and a summary line per area ({"area", "cases", "clean",
"traceback", "accepted", "unnamed", "wrote"}); --out writes them all as one JSON file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "areas",
    ["config", "overrides", "flags", "mapf", "eval", "eval_runs", "serve", "client"],
    "Which areas to try (AREAS).",
)
flags.DEFINE_list("fields", [], "config: only these fields (default: every field with a bad value).")
flags.DEFINE_list("launchers", [], "flags: only these launchers (default: every one in LAUNCHERS).")
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
HUGE = 10**30


@dataclasses.dataclass
class Case:
    """One bad input: the command, the names its error must carry, where nothing may be left."""

    name: str
    argv: list[str]
    names: tuple[str, ...]
    written: str | None = None
    extra: dict = dataclasses.field(default_factory=dict)  # more keys for the case's row


AREAS: dict[str, Callable[[str], Iterable[Case]]] = {}


def area(name: str):
    """Register `fn(tmp) -> Cases` as the area `name`."""

    def register(fn):
        AREAS[name] = fn
        return fn

    return register


def module(name: str) -> list[str]:
    return [sys.executable, "-m", name]


def run(args, timeout, cwd=ROOT) -> tuple[int | None, str]:
    """(exit code or None when it outran `timeout`, stdout + stderr)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "T2T_JAX_REEXEC": "0"}
    try:
        out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, _text(e.stdout) + _text(e.stderr)
    return out.returncode, out.stdout + out.stderr


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def snapshot(path: str | None):
    """What lies at `path` (None: nothing): its files and sizes, to tell whether a case left it as it was."""
    if not path or not os.path.exists(path):
        return None
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sorted(
        (os.path.relpath(os.path.join(r, f), path), os.path.getsize(os.path.join(r, f)))
        for r, _, files in os.walk(path)
        for f in files
    )


def classify(rc, output: str, names: tuple[str, ...], written: str | None, before=None) -> str:
    """One case's outcome (see the module docstring); `before`: what lay at `written` before the
    case (None: nothing, or an empty directory)."""
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if rc in (0, None):
        return "accepted"
    after = snapshot(written)
    if after != before and not (before is None and after == []):  # (an empty directory left is no data)
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


def attempt(area_name: str, case: Case) -> dict:
    """Run one case and class it: {"area", "case", "rc", "outcome", "last_line", ...}."""
    before = snapshot(case.written)
    rc, output = run(case.argv, FLAGS.timeout)
    outcome = classify(rc, output, case.names, case.written, before)
    row = {"area": area_name, "case": case.name, "rc": rc, "outcome": outcome, "last_line": _last(output)[:300]}
    return {**row, **case.extra}


def write(path: str, text: str | bytes) -> str:
    with open(path, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text)
    return path


# -- config: the schema's fields ------------------------------------------------------------------


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
    """(name, flag, names the error must carry) for the config area."""
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


@area("config")
def try_config(tmp):
    for i, (name, flag, names) in enumerate(config_cases()):
        workdir = os.path.join(tmp, f"config_{i}")
        argv = module("launch.main") + ["--config=configs/stage.py", flag, f"--workdir={workdir}"]
        yield Case(name, argv, names, workdir, {"flag": flag})


# -- overrides: the config file and the names of its fields ---------------------------------------


@area("overrides")
def try_overrides(tmp):
    not_python = write(os.path.join(tmp, "not_python.py"), b"\x89PNG\r\n\x1a\n\x00\x00garbage")
    syntax = write(os.path.join(tmp, "syntax.py"), "def get_config(:\n")
    no_get = write(os.path.join(tmp, "no_get_config.py"), "x = 1\n")
    workdir = os.path.join(tmp, "overrides_run")
    stage = "--config=configs/stage.py"
    cases = [  # (name, args, names)
        ("unknown field", ["--config.grpo.stepz=3"], ("--config.grpo.stepz", "grpo.steps")),
        ("unknown field, --config given", [stage, "--config.grpo.stepz=3"], ("--config.grpo.stepz",)),
        ("unknown section", ["--config.grpoo.steps=3"], ("--config.grpoo.steps",)),
        ("unknown top-level field", ["--config.sead=3"], ("--config.sead",)),
        ("unknown mesh axis (empty mesh)", ["--config.mesh.fsdpp=2"], ("--config.mesh.fsdpp",)),
        (
            "unknown mesh axis",
            ["--config=configs/qwen3_4b.py", "--config.mesh.fsdpp=2"],
            ("--config.mesh.fsdpp", "mesh.fsdp"),
        ),
        ("an override inside a field", [stage, "--config.grpo.steps.x=3"], ("--config.grpo.steps.x",)),
        ("a boolean override misspelt", [stage, "--noconfig.train.share_promts"], ("train.share_promts",)),
        ("a missing config file", ["--config=configs/nosuch.py"], ("configs/nosuch.py",)),
        ("a directory as the config file", ["--config=configs"], ("--config=configs",)),
        ("a binary config file", [f"--config={not_python}"], (not_python,)),
        ("a config file with a syntax error", [f"--config={syntax}"], (syntax,)),
        ("a config file without get_config", [f"--config={no_get}"], (no_get,)),
        ("an unknown config argument", ["--config=configs/stage.py:nosuch"], ("nosuch",)),
        ("a config argument to a file that takes one", ["--config=configs/qwen3_4b.py:x"], ("qwen3_4b.py:x",)),
        ("an override of the wrong type", [stage, "--config.grpo.steps=ten"], ("--config.grpo.steps",)),
        ("a section given a number", [stage, "--config.grpo=3"], ("--config.grpo",)),
    ]
    for name, args, names in cases:
        yield Case(f"main: {name}", module("launch.main") + [*args, f"--workdir={workdir}"], names, workdir)
    study = os.path.join(tmp, "overrides_study")
    for name, args, names in (cases[0], cases[2], cases[8], cases[13]):
        argv = module("launch.study") + [*args, "--seeds=0", "--arms=grpo", f"--workdir={study}"]
        yield Case(f"study: {name}", argv, names, study)
    for name, args, names in (cases[1], cases[8]):
        yield Case(f"aot: {name}", module("launch.aot") + args + ["--topologies=v5e:2x2"], names)


# -- flags: every flag of every launcher ----------------------------------------------------------

LAUNCHERS = {  # name -> (module, a base command line whose every flag value is legal and quick)
    "main": ("launch.main", lambda tmp: [f"--workdir={tmp}/flags_main"]),
    "study": ("launch.study", lambda tmp: ["--dry_run", f"--workdir={tmp}/flags_study"]),
    "mapf": ("launch.mapf", lambda tmp: ["show", f"--boards={_valid_board(tmp)}"]),
    "eval": ("launch.eval", lambda tmp: [f"--run={tmp}/flags_eval_run"]),
    "bench_env": ("launch.bench_env", lambda tmp: []),
    "bench_model": ("launch.bench_model", lambda tmp: ["--benches="]),
}
FLAG_CASES = {  # launcher -> bad values of its list and text flags (the numbers are found in --helpxml)
    "study": ["--seeds=x", "--seeds=-1", "--arms=grpo:bogus", "--reference=nosuch"],
    "mapf": ["--sets=nosuch"],
    "eval": ["--prompt_style=bogus", "--ood=nosuch", "--api_base=ftp://x", "--out=README.md"],
    "bench_env": ["--batches=0", "--batches=x", f"--batches={HUGE}"],
    "bench_model": ["--shapes=nosuch", "--decode_batches=0", "--decode_batches=x", "--kv=bogus", "--mixes=bogus"],
}
SKIP_FLAGS = {"study": {"config"}}  # (study's --config is the runs': see the overrides area)


def _valid_board(tmp: str) -> str:
    path = os.path.join(tmp, "flags_board.jsonl")
    if not os.path.exists(path):
        board = {"size": 4, "holes": [[1, 1]], "starts": [[0, 0], [3, 3]], "goals": [[0, 3], [3, 0]]}
        write(path, json.dumps(board) + "\n")
    return path


def declared_flags(launcher_module: str, timeout: int = 120) -> list[dict]:
    """The launcher's own flags from its --helpxml: {"name", "type", "lower_bound", "upper_bound"}."""
    rc, output = run(module(launcher_module) + ["--helpxml"], timeout)
    start = output.find("<?xml")
    if start < 0:
        raise RuntimeError(f"{launcher_module} --helpxml printed no XML (exit {rc}): {output[-500:]}")
    root = ET.fromstring(output[start : output.rindex("</AllFlags>") + len("</AllFlags>")])
    return [
        {c.tag: c.text for c in f if c.tag in ("name", "type", "lower_bound", "upper_bound")}
        for f in root.iter("flag")
        if f.findtext("key") == "yes"
    ]


def flag_values(flag: dict) -> list[str]:
    """Values absl must refuse for one flag, by its type and declared bounds."""
    kind, lo = flag.get("type"), flag.get("lower_bound")
    if kind == "int":  # (a declared upper bound is tried by the huge value)
        values = ["x", str(HUGE)] + ([str(int(lo) - 1)] if lo is not None else ["-1", "0"])
    elif kind == "float":
        values = ["x", "nan", "inf"] + ([repr(float(lo) - 1)] if lo is not None else ["-1"])
    elif kind == "bool":
        values = ["maybe"]
    elif kind and "enum" in kind:
        values = ["bogus"]
    else:
        values = []
    return list(dict.fromkeys(values))


@area("flags")
def try_flags(tmp):
    os.makedirs(f"{tmp}/flags_eval_run", exist_ok=True)
    unknown = sorted(set(FLAGS.launchers) - set(LAUNCHERS))
    if unknown:
        raise app.UsageError(f"--launchers: {unknown} not among {sorted(LAUNCHERS)}")
    for launcher in FLAGS.launchers or LAUNCHERS:
        name, base = LAUNCHERS[launcher]
        args = base(tmp)
        written = f"{tmp}/flags_{launcher}" if launcher in ("main", "study") else None
        flags_tried = [f for f in declared_flags(name, FLAGS.timeout) if f["name"] not in SKIP_FLAGS.get(launcher, ())]
        bad = [(f["name"], f"--{f['name']}={v}") for f in flags_tried for v in flag_values(f)]
        bad += [(flag.split("=", 1)[0][2:], flag) for flag in FLAG_CASES.get(launcher, [])]
        for flag_name, flag in bad:
            if launcher == "eval" and flag_name == "out":
                written = None
            yield Case(f"{launcher}: {flag}", module(name) + args + [flag], (flag_name,), written, {"flag": flag})


# -- mapf: board, plan and config files -----------------------------------------------------------

BOARD = {"size": 4, "holes": [[1, 1]], "starts": [[0, 0], [3, 3]], "goals": [[0, 3], [3, 0]]}


def _board_line(change: dict) -> str:
    return json.dumps({**BOARD, **change})


@area("mapf")
def try_mapf(tmp):
    """Cases from one valid board and plan, broken one field or one file at a time."""
    breaks = {
        "size as a string": {"size": "4"},
        "size as a bool": {"size": True},
        "size below 3": {"size": 2},
        "size above 31": {"size": 40},
        "size past int64": {"size": 2**64},
        "start outside the grid": {"starts": [[0, 0], [4, 3]]},
        "a cell past int64": {"starts": [[0, 0], [2**70, 3]]},
        "start on a hole": {"starts": [[1, 1], [3, 3]]},
        "shared starts": {"starts": [[0, 0], [0, 0]]},
        "goals and starts of different counts": {"goals": [[0, 3]]},
        "a hole as a string": {"holes": ["1,1"]},
        "17 agents": {"starts": [[0, i % 4] for i in range(17)], "goals": [[3, i % 4] for i in range(17)]},
        "bucket past int32": {"bucket": 2**40},
        "bucket negative": {"bucket": -1},
        "optimal_makespan past int64": {"optimal_makespan": 2**64},
        "optimal_makespan as a string": {"optimal_makespan": "7"},
        "plan as a list": {"plan": ["Agent 0: UP"]},
    }
    valid = write(os.path.join(tmp, "valid.jsonl"), json.dumps(BOARD) + "\n")
    plans = write(os.path.join(tmp, "plans.jsonl"), json.dumps({"text": "Agent 0: LEFT\nAgent 1: RIGHT"}) + "\n")
    mapf = module("launch.mapf")
    for i, (name, change) in enumerate(breaks.items()):
        path = write(os.path.join(tmp, f"board_{i}.jsonl"), json.dumps(BOARD) + "\n" + _board_line(change) + "\n")
        two_plans = write(os.path.join(tmp, f"plans_{i}.jsonl"), (json.dumps({"text": ""}) + "\n") * 2)
        for command in ("show", "validate", "solve") if "int" in name else ("validate",):
            extra = [f"--plans={two_plans}"] if command == "validate" else []
            yield Case(f"{command}: {name}", mapf + [command, f"--boards={path}", *extra], (f"{path}:2",))
    files = {  # whole files: name -> (content, the name its error must carry: file or file:line)
        "an empty file": ("", ""),
        "blank lines only": ("\n\n  \n", ""),
        "a truncated line": (json.dumps(BOARD)[:-7] + "\n", ":1"),
        "binary garbage": (b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage\n", ":1"),
        "JSON nested 100,000 deep": ('{"size": ' + "[" * 100_000 + "]" * 100_000 + "}\n", ":1"),
        "a 5,000-digit size": (json.dumps(BOARD).replace('"size": 4', '"size": ' + "9" * 5000) + "\n", ":1"),
        "a 5,000-digit bucket": (json.dumps(BOARD)[:-1] + ', "bucket": ' + "9" * 5000 + "}\n", ":1"),
        "NaN": (json.dumps({**BOARD, "bucket": math.nan}) + "\n", ":1"),
        "a line of 17 MiB": ('{"size": 4, "pad": "' + "x" * (17 << 20) + '"}\n', ":1"),
        "an array, not an object": ("[1, 2, 3]\n", ":1"),
        "two objects on a line": (json.dumps(BOARD) + " " + json.dumps(BOARD) + "\n", ":1"),
    }
    for i, (name, (content, suffix)) in enumerate(files.items()):
        path = write(os.path.join(tmp, f"file_{i}.jsonl"), content)
        for command in ("show", "validate", "solve") if i in (0, 3, 4, 5, 7) else ("show",):
            extra = [f"--plans={plans}"] if command == "validate" else []
            yield Case(f"{command}: {name}", mapf + [command, f"--boards={path}", *extra], (path + suffix,))
    plan_files = {
        "plans: text as a list": (json.dumps({"text": ["Agent 0: UP"]}) + "\n", ":1"),
        "plans: truncated as a string": (json.dumps({"text": "", "truncated": "yes"}) + "\n", ":1"),
        "plans: JSON nested 100,000 deep": ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n", ":1"),
        "plans: binary garbage": (b"\xff\xfe\x00\x01\n", ":1"),
        "plans: a truncated line": ('{"text": "Agent 0: UP\n', ":1"),
        "plans: fewer than the boards": ("", ""),
        "plans: more than the boards": ((json.dumps({"text": ""}) + "\n") * 3, ""),
    }
    for i, (name, (content, suffix)) in enumerate(plan_files.items()):
        path = write(os.path.join(tmp, f"plan_file_{i}.jsonl"), content)
        yield Case(f"validate: {name}", mapf + ["validate", f"--boards={valid}", f"--plans={path}"], (path + suffix,))
        if i not in (0, 5, 6):
            continue
        out = os.path.join(tmp, f"render_{i}")
        argv = mapf + ["render", f"--boards={valid}", f"--plans={path}", f"--out={out}"]
        yield Case(f"render: {name}", argv, (path + suffix,), out)
    missing = os.path.join(tmp, "missing.jsonl")
    yield Case("show: a missing file", mapf + ["show", f"--boards={missing}"], (missing,))
    yield Case(
        "validate: a missing plans file", mapf + ["validate", f"--boards={valid}", f"--plans={missing}"], (missing,)
    )
    yield Case("validate: a directory as --boards", mapf + ["validate", f"--boards={tmp}", f"--plans={plans}"], (tmp,))
    out = os.path.join(tmp, "no_such_dir", "solved.jsonl")
    yield Case("solve: --out in a missing directory", mapf + ["solve", f"--boards={valid}", f"--out={out}"],
               (os.path.dirname(out),), out)  # fmt: skip
    shown = f"{tmp}/shown"
    yield Case("show: --out (it prints)", mapf + ["show", f"--boards={valid}", f"--out={shown}"], ("--out",), shown)
    yield Case("render: --out is a file", mapf + ["render", f"--boards={valid}", f"--out={valid}"], ("--out",), valid)
    gen = f"{tmp}/gen.jsonl"
    yield Case("generate: --num=0", mapf + ["generate", "--num=0", f"--out={gen}"], ("num",), gen)
    configs = {  # environment configs for generate and stats: name -> (JSON text, names)
        "a size as a string": ('{"buckets": [{"size": "4", "agents": 2}]}', ("buckets[0].size",)),
        "an agent count as a string": ('{"buckets": [{"size": 4, "agents": [2, "3"]}]}', ("buckets[0].agents",)),
        "a size as a bool": ('{"buckets": [{"size": true, "agents": 2}]}', ("buckets[0].size",)),
        "a size of 10**30": ('{"buckets": [{"size": ' + str(HUGE) + ', "agents": 2}]}', ("size",)),
        "a 5,000-digit size": ('{"buckets": [{"size": ' + "9" * 5000 + ', "agents": 2}]}', ("size",)),
        "max_size 1e999": ('{"buckets": [{"size": 4, "agents": 2}], "max_size": 1e999}', ("max_size",)),
        "hole_density NaN": ('{"buckets": [{"size": 4, "agents": 2, "hole_density": NaN}]}', ("NaN",)),
        "nested 100,000 deep": ('{"buckets": ' + "[" * 100_000 + "]" * 100_000 + "}", ("nested",)),
        "an unknown field": ('{"buckets": [{"size": 4, "agents": 2, "sise": 5}]}', ("sise",)),
        "no buckets": ('{"buckets": []}', ("buckets",)),
        "not an object": ("[1, 2]", ("object",)),
        "truncated": ('{"buckets": [{"size": 4', ("JSON",)),
    }
    for i, (name, (text, names)) in enumerate(configs.items()):
        path = write(os.path.join(tmp, f"env_{i}.json"), text)
        out = f"{tmp}/generated_{i}.jsonl"
        argv = mapf + ["generate", f"--config={path}", "--num=4", "--certify=false", f"--out={out}"]
        yield Case(f"generate: {name}", argv, names, out)
        if i in (0, 4, 10):  # (inline: a command-line argument, so not the 200 KB one)
            yield Case(f"stats: {name} (inline)", mapf + ["stats", f"--config={text}", "--num=4"], names)
    garbage = write(os.path.join(tmp, "env_garbage.json"), b"\x00\xff\xfe garbage")
    yield Case("generate: a binary config file", mapf + ["generate", f"--config={garbage}", f"--out={gen}"],
               (garbage,), gen)  # fmt: skip
    yield Case("generate: a missing config file", mapf + ["generate", f"--config={missing}", f"--out={gen}"],
               (missing,), gen)  # fmt: skip


# -- eval: run directories ------------------------------------------------------------------------


def _fake_run(tmp: str, name: str, config: str | None = "{}", checksums: str | None = None, meta: str | None = None):
    """A run directory holding config.json and one checkpoint with these files (None: absent)."""
    root = os.path.join(tmp, name)
    step = os.path.join(root, "checkpoints", "1")
    os.makedirs(os.path.join(step, "meta") if checksums or meta else root, exist_ok=True)
    if config is not None:
        write(os.path.join(root, "config.json"), config)
    if checksums is not None:
        write(os.path.join(step, "t2t_checksums.json"), checksums)
    if meta is not None:
        write(os.path.join(step, "meta", "metadata"), meta)
    return root


@area("eval")
def try_eval(tmp):
    empty = os.path.join(tmp, "empty_run")
    os.makedirs(empty, exist_ok=True)
    cases = {
        "--run at a missing directory": ([f"--run={tmp}/no_run"], ("no_run",)),
        "--run at an empty directory": ([f"--run={empty}"], ("empty_run",)),
        "--samples=-1": ([f"--run={empty}", "--samples=-1"], ("samples",)),
    }
    for name, (args, names) in cases.items():  # (a refusal must leave the empty run empty)
        yield Case(name, module("launch.eval") + args, names, empty)


@area("eval_runs")
def try_eval_runs(tmp):
    """Damaged run directories, checkpoints and records under `launch.eval --run`."""
    empty = os.path.join(tmp, "empty_run")
    os.makedirs(empty, exist_ok=True)
    record = json.dumps({"phase": "grpo", "stage": 1, "step": 2, "counter": 3, **dict.fromkeys(
        ("history", "weights", "records", "results", "accounts"), [])})  # fmt: skip
    import hashlib

    digest = [len(record), hashlib.sha256(record.encode()).hexdigest()]
    runs = {  # name -> (run directory, the name its error must carry)
        "config.json not JSON": (_fake_run(tmp, "run_config_garbage", config="{not json"), "config.json"),
        "config.json nested 100,000 deep": (_fake_run(tmp, "run_config_deep", config="[" * 100_000), "config.json"),
        "config.json not an object": (_fake_run(tmp, "run_config_list", config="[1]"), "config.json"),
        "no checkpoint": (_fake_run(tmp, "run_no_ckpt"), "checkpoints"),
        "checksums missing": (_fake_run(tmp, "run_no_sums", meta=record), "t2t_checksums.json"),
        "checksums empty ({})": (_fake_run(tmp, "run_sums_empty", checksums="{}", meta=record), "t2t_checksums"),
        "checksums a list": (_fake_run(tmp, "run_sums_list", checksums="[1]", meta=record), "t2t_checksums"),
        "checksums binary": (_fake_run(tmp, "run_sums_bin", checksums="\x00\xff", meta=record), "t2t_checksums"),
        "checksums of a wrong size": (
            _fake_run(tmp, "run_sums_size", checksums=json.dumps({"meta/metadata": [1, digest[1]]}), meta=record),
            "meta/metadata",
        ),
        "record not JSON (checksums matching)": (
            _fake_run(tmp, "run_meta_bad", checksums=json.dumps({"meta/metadata": [3, _sha(b"{x}")]}), meta="{x}"),
            "metadata",
        ),
        "record with a bad phase (checksums matching)": (
            _fake_run(
                tmp,
                "run_meta_phase",
                checksums=json.dumps(
                    {"meta/metadata": [len(bad := record.replace("grpo", "bogus")), _sha(bad.encode())]}
                ),
                meta=bad,
            ),
            "phase",
        ),
    }
    for name, (run_dir, culprit) in runs.items():  # (a refusal must leave the run as it was)
        yield Case(name, module("launch.eval") + [f"--run={run_dir}"], (culprit,), run_dir)
    yield Case("--hf at a directory with no checkpoint", module("launch.eval") + [f"--hf={empty}"], ("--hf",), empty)
    out = write(os.path.join(tmp, "eval_out_file"), "")
    argv = module("launch.eval") + [f"--run={empty}", f"--out={out}"]
    yield Case("--out is a file", argv, ("--out",), out)


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# -- the sweep ------------------------------------------------------------------------------------


from launch import faults_serving  # noqa: E402  (issue 31: areas whose cases are finished rows)

AREAS.update(faults_serving.AREAS)


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["area"] for r in rows):
        mine = [r for r in rows if r["area"] == name]
        out.append({"area": name, "cases": len(mine), **{o: sum(r["outcome"] == o for r in mine) for o in OUTCOMES}})
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
    bad = sorted(set(FLAGS.launchers) - set(LAUNCHERS))
    if bad:
        raise app.UsageError(f"--launchers: {bad} not among {sorted(LAUNCHERS)}")
    if FLAGS.out and not os.path.isdir(os.path.dirname(os.path.abspath(FLAGS.out))):
        raise app.UsageError(f"--out: the directory of {FLAGS.out} does not exist")
    tmp = tempfile.mkdtemp(prefix="t2t_faults_")
    rows = []
    try:
        for name in FLAGS.areas:
            for case in AREAS[name](tmp):
                row = case if isinstance(case, dict) else attempt(name, case)
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
