"""The launchers' top level: `cli.run(main)` in place of `absl.app.run(main)`.

Expected errors (`EXPECTED`: a bad config field, a missing or unreadable input, a run directory
that refuses, a checkpoint that cannot be restored) print as one line, `error: ...`, and exit 2,
having written nothing; `--debug` re-raises them with the traceback. Ctrl-C exits 130 without
a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys

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


def run(main, **kwargs) -> None:
    """`absl.app.run(guarded(main), **kwargs)`."""
    app.run(guarded(main), **kwargs)
