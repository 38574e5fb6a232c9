"""Preemption: a stop requested by SIGTERM is honoured at the next boundary of a unit of work,
after a checkpoint, with exit status 0; every phase of the stage loop goes through one wrapper.

    preemption = Preemption(save)              # save(run): checkpoint a RunState, write records
    with preemption.handling():                # SIGTERM sets the request (the handler only flags)
        boards = preemption.guard(run, lambda: certify(...))        # a unit that yields a value
        run = preemption.guard(run, lambda: update(run))            # a unit that yields a RunState

`guard(run, fn)` runs one unit begun at `run`. A stop seen inside it (`check()`, called between
the unit's parts: the engine's decode chunks, evaluation batches, certified chunks) abandons the
unit and checkpoints `run`, the state it began from: the resume redoes the unit. A stop seen
after it checkpoints what the unit returned when that is a RunState (`run` otherwise). On several
processes the request is agreed by all at each check (an all-reduce of every host's flag, at the
same points of one program), so a signal to one host stops every host at the same boundary and
all of them join one checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

_routed: dict[int, Callable | None] = {}  # signal -> what its waiting thread calls (route_to_a_thread)


def route_to_a_thread(signum: int = signal.SIGTERM) -> None:
    """Take `signum` in one waiting thread: blocked in this thread and every thread it starts from
    now on, a preemption signal never lands on a collective's or a storage client's thread in the
    middle of a system call. Threads that exist already keep it unblocked, so the block must come
    first (`hostenv.block_signal` in launch/__init__.py, before numpy's and XLA's threads);
    `Preemption.handling` then uses the waiting thread."""
    if signum in _routed:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    _routed[signum] = None

    def wait():
        while True:
            signal.sigwait({signum})
            callback = _routed.get(signum)
            if callback is not None:
                callback()
            else:  # (outside a run: the signal's own action, here in this thread)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
                signal.pthread_kill(threading.get_ident(), signum)

    threading.Thread(target=wait, name=f"signal-{signum}", daemon=True).start()


class Preempted(SystemExit):
    """Raised after the stop's checkpoint is written (exit status 0)."""


class Stopped(Exception):
    """A stop seen between two parts of a unit (raised by `Preemption.check`)."""


def any_host(flag: bool) -> bool:
    """`flag` or'ed over every process (the flag itself on one process)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


class Preemption:
    """The stop request of a run and the one wrapper its units go through (module docstring).

    Args:
      save: `save(run)` writes the checkpoint of a RunState (and the records beside it); it is
        called once before `Preempted` is raised.
    """

    def __init__(self, save: Callable[[Any], None]):
        self._save = save
        self._local = False  # this host's SIGTERM
        self.requested = False  # agreed by every host

    def request(self, *_) -> None:
        """Ask for a stop (the SIGTERM handler)."""
        self._local = True

    @contextlib.contextmanager
    def handling(self, signum: int = signal.SIGTERM):
        """`signum` requests a stop while inside: through the waiting thread when the process
        routes it there (`route_to_a_thread`), else a handler (the previous one restored after)."""
        if signum in _routed:
            _routed[signum] = self.request
            try:
                yield self
            finally:
                _routed[signum] = None
            return
        previous = signal.signal(signum, self.request)
        try:
            yield self
        finally:
            signal.signal(signum, previous)

    def stop_requested(self) -> bool:
        """Whether any host asked for a stop (sticky once agreed)."""
        self.requested = self.requested or any_host(self._local)
        return self.requested

    def check(self) -> None:
        """Between the parts of a unit: raise Stopped once a stop is requested."""
        if self.stop_requested():
            raise Stopped

    def guard(self, run, fn: Callable[[], Any]):
        """`fn()` as one unit of work begun at `run` (a RunState); returns its value (see the
        module docstring for what a stop inside or after it checkpoints)."""
        try:
            out = fn()
        except Stopped:
            self.stop(run)
        if self.stop_requested():
            self.stop(out if isinstance(out, type(run)) else run)
        return out

    def stop(self, run) -> None:
        """Checkpoint `run`, then exit (status 0)."""
        self._save(run)
        raise Preempted(0)
