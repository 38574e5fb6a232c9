"""The run directory is the record: opened once per process, never overwritten, never shared.

    run = rundir.open_run(workdir, config, resume=False, allow=())   # before any work
    ...                                                                # the run
    run.close()

- A fresh start needs a new or empty directory: anything there already is refused before it is
  touched. `config.json` (the config the run began with) is written then, once, and never again.
- `--resume` needs the run's `config.json`, compares the given config with the run's current one
  (config.json with the changes of earlier resumes applied) and refuses a change to any field of
  `MATH_FIELDS` (the run's maths) unless the field is in `allow`, naming the fields; the changes
  made (allowed or not math) are appended to `history.jsonl`, one line per resume.
- A lock (`flock` on `.lock`, released by the kernel when the process dies) refuses a second
  process on the same directory at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import time

import jax

from t2t_jax.config import schema, upgrade
from t2t_jax.env import io
from t2t_jax.errors import UserError

# Fields whose change alters what the run computes (a prefix covers its section).
MATH_FIELDS = ("seed", "env", "model", "rollout", "grpo", "optim", "sft", "train", "rewards", "mesh")
LOCK, CONFIG, HISTORY = ".lock", "config.json", "history.jsonl"


class RunDirError(UserError):
    """A run directory that refuses the command (the message says why and what to do)."""


def is_math(field: str) -> bool:
    return any(field == m or field.startswith(m + ".") for m in MATH_FIELDS)


def changes(old: dict, new: dict) -> dict[str, list]:
    """Dotted field -> [old, new] for every leaf that differs (absent: None)."""
    a, b = schema.leaves(old), schema.leaves(new)
    norm = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731 (JSON reads tuples as lists)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if norm(a.get(k)) != norm(b.get(k))}


def current_config(workdir: str) -> dict:
    """The run's config now: config.json with each resume's recorded changes applied, and the
    fields added since it began filled (t2t_jax/config/upgrade.py)."""
    path = os.path.join(workdir, CONFIG)
    if not os.path.exists(path):
        raise RunDirError(f"{workdir}: no {CONFIG}, not a launch.main run directory")
    with open(path) as f:
        config = json.load(f)
    for event in read_history(workdir):
        for field, (_, value) in event.get("changes", {}).items():
            node, *path_, leaf = [config, *field.split(".")]
            for key in path_:
                node = node.setdefault(key, {})
            node[leaf] = value
    return upgrade.upgrade_config(config)


def read_history(workdir: str) -> list[dict]:
    path = os.path.join(workdir, HISTORY)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclasses.dataclass
class Run:
    """An opened run directory: `close(failed=True)` after a fresh start that failed before its
    first checkpoint removes what the start wrote (a corrected command can then start afresh)."""

    workdir: str
    lock: object | None
    fresh: bool = False
    made_dir: bool = False

    def close(self, failed: bool = False) -> None:
        if failed and self.fresh and self.lock is not None and not has_checkpoints(self.workdir):
            for name in os.listdir(self.workdir):
                path = os.path.join(self.workdir, name)
                shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
            if self.made_dir:
                os.rmdir(self.workdir)
        if self.lock is not None:
            self.lock.close()  # releases the flock
            self.lock = None


def has_checkpoints(workdir: str) -> bool:
    ckpt = os.path.join(workdir, "checkpoints")
    return os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))


def append_jsonl(path: str, item: dict) -> None:
    """One JSON line appended and synced to disk."""
    with open(path, "a") as f:
        f.write(json.dumps(item) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _lock(workdir: str):
    f = open(os.path.join(workdir, LOCK), "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise RunDirError(
            f"{workdir} is in use by another process (its lock {LOCK} is held); wait for it "
            "to finish or choose another --workdir"
        ) from None
    return f


def open_run(workdir: str, config, resume: bool = False, allow=()) -> Run:
    """Check and lock `workdir` for a fresh start or a resume (see the module docstring)."""
    workdir = os.path.abspath(workdir)
    given = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    allow = tuple(a for a in allow if a)
    unknown = [
        a
        for a in allow
        if a not in schema.leaves(given) and not any(k.startswith(a + ".") for k in schema.leaves(given))
    ]
    if unknown:
        raise RunDirError(f"--allow_changes: {unknown[0]!r} is not a config field")
    if jax.process_index() != 0:  # (other hosts read the directory; process 0 owns it)
        return Run(workdir, None)
    if not resume:
        if allow:
            raise RunDirError("--allow_changes: only with --resume")
        if os.path.exists(workdir) and [n for n in os.listdir(workdir) if n != LOCK]:
            raise RunDirError(
                f"{workdir} already holds a run ({', '.join(sorted(os.listdir(workdir))[:4])}): "
                "pass --resume to continue it, or choose another --workdir"
            )
        made = not os.path.exists(workdir)
        os.makedirs(workdir, exist_ok=True)
        run = Run(workdir, _lock(workdir), fresh=True, made_dir=made)
        if [n for n in os.listdir(workdir) if n != LOCK]:  # (another process started it meanwhile)
            run.close()
            raise RunDirError(f"{workdir} was started by another process meanwhile")
        io.write_atomic(os.path.join(workdir, CONFIG), json.dumps(given, indent=1))
        return run
    if not os.path.exists(os.path.join(workdir, CONFIG)):
        raise RunDirError(f"--resume: {workdir} holds no {CONFIG}: not a launch.main run to resume")
    run = Run(workdir, _lock(workdir))
    try:
        diff = changes(current_config(workdir), given)
        refused = {
            k: v for k, v in diff.items() if is_math(k) and not any(k == a or k.startswith(a + ".") for a in allow)
        }
        if refused:
            listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
            raise RunDirError(
                f"--resume changes the run's maths: {listed}. Resume with the run's own values "
                f"(its {CONFIG} and {HISTORY}), or name the fields in --allow_changes="
                f"{','.join(refused)}"
            )
        if diff:
            append_jsonl(
                os.path.join(workdir, HISTORY),
                {
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "event": "resume",
                    "changes": diff,
                    "allowed": sorted(a for a in allow),
                },
            )
    except BaseException:
        run.close()
        raise
    return run
