"""Several hosts, one program: start-up and the values every host must agree on.

    distributed.initialize(config.distributed)     # first, before anything touches a device
    run = distributed.same_outcome(lambda: rundir.open_run(...))   # one host's refusal stops all
    proposal = distributed.from_host0(proposal)    # host 0's value on every host (JSON-able)
    parts = distributed.from_every_host(part)      # [every host's value], in process order

Every host of a pod runs the same command (`python -m launch.main ...`); collectives pair up only
if every host reaches them in the same order, so a decision one host makes alone (a refused run
directory, a stop) is shared before anyone acts on it. On one process every function here is the
identity.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import jax
import numpy as np

from t2t_jax.errors import UserError

MESSAGE_BYTES = 4096  # an error message shared between hosts is cut to this


def initialize(config) -> None:
    """`jax.distributed.initialize` when `distributed.enabled` (coordinator, processes and process
    id from the config, or auto-detected on TPU pods / SLURM when left empty); a no-op when off or
    already done. Must run before any JAX call that starts a backend."""
    if not config.enabled or jax.distributed.is_initialized():
        return
    kwargs = {
        k: v
        for k, v in (
            ("coordinator_address", config.coordinator_address),
            ("num_processes", config.num_processes),
            ("process_id", config.process_id),
        )
        if v not in (None, "", -1)
    }
    jax.distributed.initialize(**kwargs)


def _bytes_from_host0(data: bytes) -> bytes:
    from jax.experimental import multihost_utils

    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(data))))
    buf = np.zeros(size, np.uint8)
    if jax.process_index() == 0:
        buf[:] = np.frombuffer(data, np.uint8)
    return multihost_utils.broadcast_one_to_all(buf).tobytes() if size else b""


def from_host0(value: Any) -> Any:
    """Host 0's `value` (JSON-able) on every host."""
    if jax.process_count() == 1:
        return value
    return json.loads(_bytes_from_host0(json.dumps(value).encode()))


def from_every_host(value: Any) -> list:
    """Every host's `value` (JSON-able), in process order, on every host."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.int64(data.size))).reshape(-1)
    buf = np.zeros(max(int(sizes.max()), 1), np.uint8)
    buf[: data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(buf))
    return [json.loads(row[:n].tobytes()) for row, n in zip(rows, sizes)]


def exit_alone(error: BaseException) -> NoReturn:
    """This host failed mid-run on its own (several hosts): print the error and end the process at
    once, skipping JAX's shutdown barrier. A host waiting in that barrier while its peers wait in a
    collective for it would leave every host waiting forever; a process that is gone is seen by
    the coordination service within its heartbeat timeout (100 s), which then ends every peer."""
    if isinstance(error, UserError):
        print(f"error: {error} (process {jax.process_index()})", file=sys.stderr)
    else:
        traceback.print_exception(error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130 if isinstance(error, KeyboardInterrupt) else 2 if isinstance(error, UserError) else 1)


def same_outcome(fn: Callable[[], Any]) -> Any:
    """`fn()` on every host; an expected error (UserError) on any host is raised on every host
    (the first failing host's message), so no host goes on to wait in a collective for one that
    stopped."""
    try:
        out, error = fn(), ""
    except UserError as e:
        out, error = None, str(e) or type(e).__name__
        if jax.process_count() == 1:
            raise
    if jax.process_count() == 1:
        return out
    from jax.experimental import multihost_utils

    data = np.frombuffer(error.encode()[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, b"\0"), np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(data))
    messages = [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in rows]
    failed = [i for i, m in enumerate(messages) if m]
    if not failed:
        return out
    first = failed[0]
    raise UserError(messages[first] if first == 0 else f"host {first}: {messages[first]}")
