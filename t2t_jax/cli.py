"""The launchers' top level: `cli.run(main)` in place of `absl.app.run(main)`.

Expected errors (`EXPECTED`: a bad config field, a missing or unreadable input, a run directory
that refuses, a checkpoint that cannot be restored) print as one line, `error: ...`, and exit 2,
having written nothing; `--debug` re-raises them with the traceback. Ctrl-C exits 130 without
a traceback. Anything else is a bug and keeps its traceback.

Config files (`cli.DEFINE_config_file`, ml_collections' `config_flags.DEFINE_config_file` with a
check in front): the command line's `--config=FILE[:ARG]` and its `--config.a.b=value` overrides
are checked before ml_collections loads them (`config_error`), so a missing file, a config
argument its `get_config` refuses, or an override naming no field is one line naming the flag,
with the closest field (`--config.grpo.stepz: unknown field grpo.stepz; did you mean
grpo.steps?`), exit 2. ml_collections resolves overrides of a default config at import time and
of a given one while absl parses the flags: the check runs at both points (`DEFINE_config_file`,
`run`).

Flags (`finite`): absl's bounds let nan through (every comparison with nan is false); give float
flags with bounds `finite()` as a validator too.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
from collections.abc import Mapping

from absl import app, flags

from t2t_jax.errors import UserError

_DEBUG = flags.DEFINE_bool(
    "debug",
    False,
    "Show the traceback of an expected error (config, files, run directory, checkpoints) instead of one line.",
)

EXPECTED = (
    UserError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    json.JSONDecodeError,
    app.UsageError,
)

_CONFIG_FLAGS: dict[str, str | None] = {}  # config flags defined through DEFINE_config_file: name -> default


def check_out(out: str) -> None:
    """--out (or its default), checked before any work: a directory that exists or can be made."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out: {out} is a file; give a directory")
    parent = os.path.abspath(out)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out: {parent} is not a writable directory")


def fail(message: str, code: int = 2):
    """Print `error: message` on stderr and exit with `code`."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def guarded(main):
    """`main` with the expected errors as one line (see the module docstring)."""

    def wrapped(argv):
        try:
            return main(argv)
        except EXPECTED as e:
            if _DEBUG.value:
                raise
            fail(str(e) if not isinstance(e, OSError) or not e.filename else f"{e.strerror}: {e.filename}")
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            sys.exit(130)

    return wrapped


def run(main, flags_parser=None, **kwargs) -> None:
    """`absl.app.run(guarded(main), **kwargs)`, with the config flags' command line checked before
    absl parses it (`config_error`) and a flag that absl refuses (unknown, of the wrong type or out
    of its bounds) as one line, exit 2, like every other bad input."""
    parse = flags_parser or flags.FLAGS

    def checked_parse(argv):
        for name, default in _CONFIG_FLAGS.items():
            message = config_error(argv, name, default)
            if message:
                fail(message)
        try:
            return parse(argv)
        except flags.Error as e:
            lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
            fail(lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1]}")  # (one line)

    app.run(guarded(main), flags_parser=checked_parse, **kwargs)


# -- config files and their overrides -------------------------------------------------------------


def DEFINE_config_file(name: str = "config", default: str | None = None, help_string: str = "", **kwargs):  # noqa: N802
    """`config_flags.DEFINE_config_file`, the command line checked first (see the module docstring)."""
    from ml_collections import config_flags

    _CONFIG_FLAGS[name] = default
    argv = sys.argv
    if default is not None and _overrides(argv, name) and _config_spec(argv, name) is None:
        message = config_error(argv, name, default)  # (ml_collections resolves them now, at import)
        if message:
            fail(message)
    return config_flags.DEFINE_config_file(name, default, help_string or "A config file.", **kwargs)


def _expanded(argv: list[str]) -> list[str]:
    """argv with --flagfile=... expanded, as ml_collections reads it."""
    try:
        return flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False)
    except flags.Error:
        return list(argv)  # (absl's parser reports the flagfile itself)


def _config_spec(argv: list[str], name: str) -> str | None:
    """The value of the first `--name=VALUE` / `--name VALUE` in argv (as ml_collections finds it)."""
    pattern = re.compile(rf"^-{{1,2}}{re.escape(name)}(=|$)")
    for i, arg in enumerate(argv):
        if pattern.match(arg):
            if "=" in arg:
                return arg.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def _overrides(argv: list[str], name: str) -> list[str]:
    """The field paths of argv's `--name.a.b=value` (and `--noname.a.b`) overrides, in order."""
    pattern = re.compile(rf"^-{{1,2}}(?:no)?{re.escape(name)}\.([^=]*)")
    return [m.group(1) for m in map(pattern.match, argv) if m]


def load_config_file(spec: str, name: str = "config"):
    """The config of `FILE[:ARG]` (its `get_config(ARG)`), as ml_collections loads it; UserError
    names `--name` for a file that is missing or not a config file, or an ARG it refuses."""
    path, colon, arg = spec.partition(":")
    flag = f"--{name}={spec}"
    if not path:
        raise UserError(f"{flag}: give a config file (.py)")
    if not os.path.exists(path):
        raise UserError(f"{flag}: {path}: no such file")
    if os.path.isdir(path):
        raise UserError(f"{flag}: {path} is a directory, not a config file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{flag}: {path} is not readable")
    try:
        loader_spec = importlib.util.spec_from_file_location(f"{name}_config_check", path)
        if loader_spec is None or loader_spec.loader is None:
            raise UserError(f"{flag}: {path} is not a Python config file")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    except SyntaxError as e:
        if e.lineno is None:  # (NUL bytes: not Python text at all)
            raise UserError(f"{flag}: {path} is not a Python config file ({e.msg})") from None
        raise UserError(f"{flag}: {path}:{e.lineno}: {e.msg}") from None
    except (UnicodeDecodeError, ValueError) as e:  # (binary garbage, NUL bytes)
        raise UserError(f"{flag}: {path} is not a Python config file ({e})") from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise UserError(f"{flag}: {path} defines no get_config()")
    args = [arg] if colon else []
    try:
        inspect.signature(get_config).bind(*args)
    except TypeError:
        raise UserError(f"{flag}: {path}'s get_config takes no argument (got {arg!r})") from None
    except ValueError:
        pass  # (no signature to inspect)
    try:
        return get_config(*args)
    except (UserError, ValueError, KeyError) as e:
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise UserError(f"{flag}: {message}") from None


def _paths(node, prefix: str = "") -> list[str]:
    """Every dotted path into a config: sections, fields, and the keys of mappings (mesh axes)."""
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.append(path)
        if isinstance(value, Mapping) or hasattr(value, "items") and callable(value.items):
            out.extend(_paths(value, path + "."))
    return out


def _closest(word: str, choices) -> str | None:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return match[0] if match else None


def override_error(config, path: str, name: str = "config") -> str | None:
    """Why `--name.PATH=...` names nothing in `config` (one line, with the closest path), or None."""
    flag = f"--{name}.{path}"
    if "[" in path:  # (tuple indices: ml_collections' own rules)
        return None
    node, done = config, []
    for key in path.split("."):
        is_mapping = isinstance(node, Mapping) or hasattr(node, "items") and hasattr(node, "keys")
        if not is_mapping:
            return f"{flag}: {'.'.join(done)} is a field ({type(node).__name__}), not a section"
        keys = list(node.keys())
        if key not in keys:
            where = ".".join([*done, key])
            if done == ["mesh"]:  # (its axes are free names: the sharding rules use data, fsdp, tensor)
                guess = _closest(key, keys)
                if guess:
                    return f"{flag}: unknown mesh axis {where}; did you mean mesh.{guess}?"
                axes = ", ".join(keys) or "none"
                return (
                    f"{flag}: unknown mesh axis {where} (this config's mesh axes: {axes}); "
                    f"give the whole mesh instead: --{name}.mesh=\"{{'data': 1, 'fsdp': -1, 'tensor': 1}}\""
                )
            guess = _closest(path, _paths(config)) or (".".join([*done, g]) if (g := _closest(key, keys)) else None)
            section = f" (no section {where})" if where != path else ""
            known = ", ".join(sorted(map(str, keys))[:12]) + (", ..." if len(keys) > 12 else "")
            hint = f"; did you mean {guess}?" if guess else f" (known at {'.'.join(done) or 'the top'}: {known})"
            return f"{flag}: unknown field {path}{section}{hint}"
        node = node[key]
        done.append(key)
    return None


def config_error(argv: list[str], name: str = "config", default: str | None = None) -> str | None:
    """The first problem with argv's `--name=FILE[:ARG]` (or `default`) and its `--name.a.b=value`
    overrides, as one line naming the flag; None when ml_collections may load them."""
    argv = _expanded(argv)
    spec = _config_spec(argv, name)
    overrides = _overrides(argv, name)
    if spec is None:
        if default is None:
            return f"--{name}.{overrides[0]}: give the config file first (--{name}=FILE)" if overrides else None
        if not overrides:
            return None  # (the default, unchanged: the launcher reads it as it is)
        spec = default
    try:
        config = load_config_file(spec, name)
    except UserError as e:
        return str(e)
    if config is None or not hasattr(config, "items"):
        return f"--{name}={spec}: get_config() returned {type(config).__name__}, not a config"
    for path in overrides:
        message = override_error(config, path, name)
        if message:
            return message
    return None


# -- flag validators -------------------------------------------------------------------------------


def finite(*names: str) -> None:
    """Float flags that must be finite (absl's lower_bound / upper_bound let nan and inf through)."""
    for flag in names:
        flags.register_validator(
            flag, lambda v: v is None or math.isfinite(v), message=f"--{flag} must be a finite number"
        )


def int_list(name: str, lo: int, hi: int) -> None:
    """A list flag whose items must be integers in [lo, hi]."""

    def check(values) -> bool:
        try:
            return all(lo <= int(v) <= hi for v in values)
        except (TypeError, ValueError):
            return False

    flags.register_validator(name, check, message=f"--{name}: give comma-separated integers in [{lo}, {hi}]")


def one_of(name: str, legal) -> None:
    """A string or list flag whose value (each item) must be one of `legal`."""
    legal = list(legal)

    def check(value) -> bool:
        return all(v in legal for v in (value if isinstance(value, list) else [value]))

    flags.register_validator(name, check, message=f"--{name}: each value must be one of {legal}")
