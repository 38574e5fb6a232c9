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
- A lock (`RunLock`, the object `.lock`) refuses a second process on the same directory at once,
  naming the lock and its owner (host, pid, start). On a local disk it is an `flock`, released
  by the kernel when the process dies. On object storage (`gs://`) it is an object created with a
  create-only write (the precondition ifGenerationMatch=0) holding the owner and a heartbeat that
  a thread refreshes every `HEARTBEAT_S` while the run lives; close() deletes it. A lock whose
  heartbeat is older than `STALE_S` (or whose owner, on this host, is no longer running) is stale:
  it is refused too, naming it, until `break_lock=True` (launch.main's `--break_lock`) takes it
  over.

Every file goes through t2t_jax/storage.py, so `workdir` may be a local path or a gs:// URL.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import socket
import sys
import threading
import time
import uuid

import jax

from t2t_jax import storage
from t2t_jax.config import schema, upgrade
from t2t_jax.env import io
from t2t_jax.errors import UserError

# Fields whose change alters what the run computes (a prefix covers its section).
MATH_FIELDS = ("seed", "grpo_seed", "env", "model", "rollout", "grpo", "optim", "sft", "train", "rewards", "mesh")
LOCK, CONFIG, HISTORY = ".lock", "config.json", "history.jsonl"
HEARTBEAT_S, STALE_S = 30.0, 180.0  # the object-storage lock's heartbeat, and the age that makes it stale


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
    path = storage.join(workdir, CONFIG)
    if not storage.exists(path):
        raise RunDirError(f"{workdir}: no {CONFIG}, not a launch.main run directory")
    config = json.loads(storage.read_text(path))
    for event in read_history(workdir):
        for field, (_, value) in event.get("changes", {}).items():
            node, *path_, leaf = [config, *field.split(".")]
            for key in path_:
                node = node.setdefault(key, {})
            node[leaf] = value
    return upgrade.upgrade_config(config)


def read_history(workdir: str) -> list[dict]:
    path = storage.join(workdir, HISTORY)
    if not storage.exists(path):
        return []
    return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]


def _owner_text(owner: dict) -> str:
    started = owner.get("started")
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)) + "Z" if isinstance(started, (int, float)) else "?"
    return f"host {owner.get('host', '?')}, pid {owner.get('pid', '?')}, since {since}"


def _pid_gone(pid) -> bool:
    """True when `pid` is no longer a process of this host."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, TypeError, ValueError):
        return False
    return False


class RunLock:
    """The lock of one run directory (see the module docstring): `RunLock.acquire(workdir)`,
    then `close()`. Raises RunDirError naming the lock, its owner and what to do."""

    def __init__(self, workdir: str, path: str, owner: dict, handle=None):
        self.workdir, self.path, self.owner, self._handle = workdir, path, owner, handle
        self._stop = threading.Event()
        self._thread = None

    @classmethod
    def acquire(cls, workdir: str, break_lock: bool = False) -> RunLock:
        path = storage.join(workdir, LOCK)
        now = time.time()
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": now, "heartbeat": now}
        if not storage.is_url(workdir):
            return cls._acquire_flock(workdir, path, owner)
        owner["token"] = uuid.uuid4().hex
        try:
            return cls._acquire_object(workdir, path, owner, break_lock)
        except OSError as e:  # (FileExistsError is handled inside)
            why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
            raise RunDirError(
                f"{workdir}: cannot write its lock {path} ({why}): check that the bucket exists and that "
                "this machine's credentials may write to it"
            ) from None

    @classmethod
    def _acquire_object(cls, workdir: str, path: str, owner: dict, break_lock: bool) -> RunLock:
        text = json.dumps(owner)
        try:
            storage.create_exclusive(path, text)
        except FileExistsError:
            held = cls._read(path)
            if held is None:  # (released meanwhile: one more try)
                try:
                    storage.create_exclusive(path, text)
                except FileExistsError:
                    held = cls._read(path) or {}
            if held is not None:
                cls._refuse_or_break(workdir, path, held, break_lock)
                storage.write_atomic(path, text)
                print(f"warning: {path}: took over the stale lock of {_owner_text(held)}", file=sys.stderr, flush=True)
        if (cls._read(path) or {}).get("token") != owner["token"]:  # (another process won the race)
            held = cls._read(path) or {}
            raise RunDirError(
                f"{workdir} is in use by another process (its lock {path} is held by {_owner_text(held)}); "
                "wait for it to finish or choose another --workdir"
            )
        lock = cls(workdir, path, owner)
        lock._thread = threading.Thread(target=lock._beat, name="t2t-run-lock-heartbeat", daemon=True)
        lock._thread.start()
        return lock

    @staticmethod
    def _acquire_flock(workdir: str, path: str, owner: dict) -> RunLock:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            try:
                held = _owner_text(json.loads(f.read()))
            except ValueError:
                held = "an unknown owner"
            f.close()
            raise RunDirError(
                f"{workdir} is in use by another process (its lock {path} is held by {held}); wait for it "
                "to finish or choose another --workdir"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps(owner))
        f.flush()
        return RunLock(workdir, path, owner, handle=f)

    @staticmethod
    def _read(path: str) -> dict | None:
        """The lock's owner record; None when there is no lock, {} when it is unreadable."""
        try:
            held = json.loads(storage.read_text(path))
            return held if isinstance(held, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    @staticmethod
    def _refuse_or_break(workdir: str, path: str, held: dict, break_lock: bool) -> None:
        beat = held.get("heartbeat")
        age = time.time() - beat if isinstance(beat, (int, float)) else float("inf")
        gone = held.get("host") == socket.gethostname() and _pid_gone(held.get("pid"))
        if age <= STALE_S and not gone:
            raise RunDirError(
                f"{workdir} is in use by another process (its lock {path} is held by {_owner_text(held)}, "
                f"heartbeat {age:.0f} s ago); wait for it to finish or choose another --workdir"
            )
        if not break_lock:
            why = "its process is gone" if gone else f"no heartbeat for {age:.0f} s, more than {STALE_S:.0f} s"
            raise RunDirError(
                f"{workdir}: its lock {path} is stale (held by {_owner_text(held)}; {why}): if no process "
                "runs on this directory any more, pass --break_lock to take it over"
            )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                held = self._read(self.path)
                if (held or {}).get("token") != self.owner["token"]:
                    print(
                        f"warning: {self.path}: the run directory's lock was taken over by "
                        f"{_owner_text(held or {})}; no longer refreshing it",
                        file=sys.stderr,
                        flush=True,
                    )
                    return
                self.owner["heartbeat"] = time.time()
                storage.write_atomic(self.path, json.dumps(self.owner))
            except Exception as e:  # (a transient storage error: the next beat tries again)
                print(f"warning: {self.path}: lock heartbeat failed ({e})", file=sys.stderr, flush=True)

    def close(self, remove: bool = False) -> None:
        """Release the lock (an object-storage lock is deleted, if still ours; a local lock file
        is left unless `remove`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._handle is not None:
            if remove:
                storage.remove_tree(self.path)
            self._handle.close()  # releases the flock
            self._handle = None
        elif storage.is_url(self.path) and (self._read(self.path) or {}).get("token") == self.owner.get("token"):
            storage.remove_tree(self.path)


@dataclasses.dataclass
class Run:
    """An opened run directory: `close(failed=True)` after a fresh start that failed before its
    first checkpoint removes what the start wrote (a corrected command can then start afresh)."""

    workdir: str
    lock: RunLock | None
    fresh: bool = False
    made_dir: bool = False

    def close(self, failed: bool = False) -> None:
        if self.lock is None:
            return
        if failed and self.fresh and not has_checkpoints(self.workdir):
            for name in storage.listdir(self.workdir) if storage.exists(self.workdir) else []:
                if name != LOCK:
                    storage.remove_tree(storage.join(self.workdir, name))
            self.lock.close(remove=True)
            if self.made_dir and storage.exists(self.workdir):
                storage.remove(self.workdir)
        else:
            self.lock.close()
        self.lock = None


def has_checkpoints(workdir: str) -> bool:
    ckpt = storage.join(workdir, "checkpoints")
    return storage.isdir(ckpt) and any(n.isdigit() for n in storage.listdir(ckpt))


def append_jsonl(path: str, item: dict) -> None:
    """One JSON line appended and synced to disk (on gs://: the object rewritten whole)."""
    storage.append_line(path, json.dumps(item))


def open_run(workdir: str, config, resume: bool = False, allow=(), break_lock: bool = False) -> Run:
    """Check and lock `workdir` (a local path or a gs:// URL) for a fresh start or a resume (see
    the module docstring); `break_lock` takes over a stale lock."""
    workdir = storage.resolve(workdir)
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
        present = storage.listdir(workdir) if storage.exists(workdir) else []
        if [n for n in present if n != LOCK]:
            raise RunDirError(
                f"{workdir} already holds a run ({', '.join(present[:4])}): "
                "pass --resume to continue it, or choose another --workdir"
            )
        made = not storage.exists(workdir)
        storage.makedirs(workdir)
        run = Run(workdir, RunLock.acquire(workdir, break_lock), fresh=True, made_dir=made)
        if [n for n in storage.listdir(workdir) if n != LOCK]:  # (another process started it meanwhile)
            run.close()
            raise RunDirError(f"{workdir} was started by another process meanwhile")
        io.write_atomic(storage.join(workdir, CONFIG), json.dumps(given, indent=1))
        return run
    if not storage.exists(storage.join(workdir, CONFIG)):
        raise RunDirError(f"--resume: {workdir} holds no {CONFIG}: not a launch.main run to resume")
    run = Run(workdir, RunLock.acquire(workdir, break_lock))
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
                storage.join(workdir, HISTORY),
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
