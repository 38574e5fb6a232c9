"""Checkpoints with Orbax: the train state (params, optimizer, step) and the run's JSON record.

    ckpt = Checkpointer(workdir / "checkpoints", keep=3)
    ckpt.save(step, state, meta)           # meta: JSON (stage index, phase, config history,
                                           # engineer records, results, RNG seed and counters)
    state, meta = ckpt.restore(ckpt.latest(), like=state)
    meta = ckpt.meta(ckpt.latest())        # the JSON record alone

Orbax writes each step to a temporary directory and renames it when complete, so `latest()`
only ever names a complete checkpoint: a run killed mid-save resumes from the one before.
Saves are synchronous (the stage loop is not waiting on the disk for long at these sizes, and a
SIGTERM handler must know the save finished before the process exits).
"""
from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """An Orbax CheckpointManager keeping the last `keep` steps under `directory`."""

    def __init__(self, directory: str, keep: int = 3):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state, meta: dict) -> None:
        """Write `state` (a pytree of arrays) and `meta` (JSON) as checkpoint `step`
        (an existing checkpoint at `step` is kept, not rewritten)."""
        if step in self.manager.all_steps():
            return
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def latest(self) -> int | None:
        return self.manager.latest_step()

    def meta(self, step: int) -> dict:
        """The JSON record of checkpoint `step` alone (to shape the state restore from it)."""
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, like):
        """-> (state shaped and sharded like `like`, meta dict) of checkpoint `step`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], out["meta"]

    def close(self) -> None:
        self.manager.close()
