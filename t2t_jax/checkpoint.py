"""Checkpoints with Orbax: the train state (params, optimizer, step) and the run's JSON record.

    ckpt = Checkpointer(workdir / "checkpoints", keep=3)
    ckpt.save(step, state, meta)           # meta: JSON (stage index, phase, config history,
                                           # engineer records, results, RNG seed and counters)
    step = ckpt.latest_intact()            # the newest checkpoint whose checksums match
    state, meta = ckpt.restore(step, like=state)
    meta = ckpt.meta(step)                 # the JSON record alone

Orbax writes each step to a temporary directory and renames it when complete, so `latest()`
only ever names a complete checkpoint: a run killed mid-save resumes from the one before.
Saves are synchronous (the stage loop is not waiting on the disk for long at these sizes, and a
SIGTERM handler must know the save finished before the process exits).

Integrity: after a save, process 0 writes `CHECKSUMS` into the step's directory (the SHA-256
and size of every file of the step; about 1 s per GB). `latest_intact()` verifies the newest
steps in turn: a step whose files are missing, truncated or changed is moved aside to
`../corrupt_checkpoints/STEP` with a warning naming it and the file, and the one before is
tried; none intact is a `CheckpointError`. (A step written before checksums existed is
trusted as it is.)

The directory may be a local path or a gs:// URL: Orbax writes either (through etils.epath and
tensorstore), and the checksums, their verification and the set-aside go through
t2t_jax/storage.py, so a bucket is verified as a disk is (on GCS the set-aside copies the
step's objects, then deletes them: there is no rename).
"""

from __future__ import annotations

import hashlib
import json
import sys

import jax
import orbax.checkpoint as ocp

from t2t_jax import storage
from t2t_jax.errors import UserError

CHECKSUMS = "t2t_checksums.json"


class CheckpointError(UserError):
    """No intact checkpoint to restore (the message names the directory and what was wrong)."""


def file_digests(directory: str) -> dict[str, list]:
    """Relative path -> [size, sha256 hex] of every file under `directory` but CHECKSUMS."""
    out = {}
    for rel in storage.walk_files(directory):
        if rel == CHECKSUMS:
            continue
        h, size = hashlib.sha256(), 0
        with storage.open(storage.join(directory, rel), "rb") as f:
            for block in iter(lambda: f.read(1 << 23), b""):
                h.update(block)
                size += len(block)
        out[rel] = [size, h.hexdigest()]
    return out


def verify(step_dir: str) -> str | None:
    """None when the step's files match its CHECKSUMS (or it has none), else what differs."""
    path = storage.join(step_dir, CHECKSUMS)
    if not storage.exists(path):
        return None
    try:
        expected = json.loads(storage.read_text(path))
    except (OSError, ValueError) as e:
        return f"{CHECKSUMS} unreadable ({e})"
    actual = file_digests(step_dir)
    for rel, (size, digest) in expected.items():
        if rel not in actual:
            return f"{rel} is missing"
        if actual[rel][0] != size:
            return f"{rel} has {actual[rel][0]} bytes, {size} were written"
        if actual[rel][1] != digest:
            return f"{rel} differs from what was written (sha256)"
    return None


class Checkpointer:
    """An Orbax CheckpointManager keeping the last `keep` steps under `directory`."""

    def __init__(self, directory: str, keep: int = 3):
        self.directory = storage.resolve(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state, meta: dict) -> None:
        """Write `state` (a pytree of arrays) and `meta` (JSON) as checkpoint `step`, then its
        checksums (an existing checkpoint at `step` is kept, not rewritten)."""
        if step in self.manager.all_steps():
            return
        self.manager.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True
        )
        self.manager.wait_until_finished()
        if jax.process_index() == 0:
            step_dir = self._step_dir(step)
            storage.write_atomic(storage.join(step_dir, CHECKSUMS), json.dumps(file_digests(step_dir)))

    def _step_dir(self, step: int) -> str:
        return storage.join(self.directory, str(step))

    def latest(self) -> int | None:
        """The newest complete checkpoint (not verified: see latest_intact)."""
        return self.manager.latest_step()

    def latest_intact(self) -> int | None:
        """The newest checkpoint whose files match their checksums; newer corrupt ones are moved
        to ../corrupt_checkpoints/ with a warning. None when there are none; CheckpointError when
        there were some and none is intact."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        problems = []
        for step in steps:
            problem = verify(self._step_dir(step))
            if problem is None:
                if problems:
                    print(
                        f"warning: restoring checkpoint {step} of {self.directory}; newer ones were corrupt: "
                        + "; ".join(problems),
                        file=sys.stderr,
                        flush=True,
                    )
                return step
            problems.append(f"{step}: {problem}")
            if jax.process_index() == 0:
                aside = storage.join(storage.dirname(self.directory), "corrupt_checkpoints", str(step))
                storage.remove_tree(aside)
                storage.move(self._step_dir(step), aside)
            self.manager.reload()
        if problems:
            raise CheckpointError(
                f"no intact checkpoint under {self.directory} (moved aside to "
                f"corrupt_checkpoints/): " + "; ".join(problems)
            )
        return None

    def meta(self, step: int) -> dict:
        """The JSON record of checkpoint `step` alone (to shape the state restore from it)."""
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, like):
        """-> (state shaped and sharded like `like`, meta dict) of checkpoint `step`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        return out["state"], out["meta"]

    def close(self) -> None:
        self.manager.close()
