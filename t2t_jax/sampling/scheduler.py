"""The engine's host side: how much cache a call allocates (`slot_tokens`, `pool_pages`) and
which row each decode slot holds as the call goes on (`Scheduler`). Nothing here touches the
device: the engine (engine.py) runs the jitted steps (slots.py) where the scheduler says.

    rows = PageTable(...) or DenseRows(...)                      # the cache's row map (pages.py)
    sched = Scheduler(rows, chunk, prompt_tokens, budgets, n, length)
    while sched.busy():
        preempted = sched.grow()                 # each live row's next chunk fits, or the youngest gives way
        admitted, slots = sched.admit()          # queued rows into free slots, while they fit
        idx, window = sched.plan()               # the slots and cache columns the next chunk decodes
        finished = sched.advance(step, done)     # the device's counters after the chunk
        rows_done = sched.release(finished)

Rows are (prompt i, sample j) = row i * n + j. A row is admitted when its prompt and first chunk
fit the cache, grows a chunk at a time (the lowest row first), and when a shard of a paged pool
runs out the youngest row there gives its pages back and queues again at the front (made again
later, it comes out the same: its random stream is keyed by row and step). A dense cache's rows
always fit.
"""

from __future__ import annotations

from collections import deque

import numpy as np


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def bucket(n: int) -> int:
    """`n` rounded up to one of 16 sizes per octave (a multiple of 2^(ceil(log2 n) - 5), at least
    16): at most 1/16 over, and the paper config's 8,704 (512 + 8,192) stays 8,704."""
    n = max(int(n), 1)
    step = max(16, 1 << max((n - 1).bit_length() - 5, 0))
    return -(-n // step) * step


def slot_tokens(tokens: int, page_size: int = 1) -> int:
    """The cache tokens the engine allocates per decode slot for a call whose rows need up to
    `tokens` (padded prompt + largest budget; not an allocation to round again): `bucket(tokens)`
    in whole pages of `page_size` (a dense cache: page_size 1; a paged one's table holds
    slot_tokens // page_size pages). Sized per call: a long call's cache is given back when it
    ends. launch.aot sizes the decode step's cache with it."""
    return -(-bucket(tokens) // page_size) * page_size


def pool_pages(slots: int, length: int, page_size: int, shards: int = 1, pages: int = 0) -> int:
    """Pages in a paged engine's pool for slots of `length` tokens (a `slot_tokens` allocation):
    `pages` when set (rollout.pages), else every slot's length // page_size and a null page per
    shard."""
    return pages or slots * (length // page_size) + shards


class Scheduler:
    """The host state of one `Engine.generate` call (see the module docstring).

    Args:
      rows: the cache's row map (pages.py `PageTable` or `DenseRows`).
      chunk: decode steps per device call.
      prompt: [B] cache tokens each prompt takes in a slot (`rows.prompt_tokens`).
      budgets: [B * n] new tokens allowed per row.
      n: samples per prompt.
      length: tokens per slot (`slot_tokens`).

    Raises ValueError (from the row map) when a row can never fit.
    """

    def __init__(self, rows, chunk: int, prompt, budgets, n: int, length: int):
        self.rows, self.chunk, self.n, self.length = rows, chunk, n, length
        self.prompt, self.budgets = np.asarray(prompt, np.int64), np.asarray(budgets, np.int64)
        self.need = self.prompt.repeat(n) + self.budgets  # [B * n] tokens a row holds at most
        rows.check(int(self.need.max(initial=0)))
        self.queue = deque(range(len(self.budgets)))
        self.occupant = np.full(rows.slots, -1)  # the row in each slot (-1: free)
        self.step = np.zeros(rows.slots, np.int64)  # tokens made in each slot
        self.held = np.zeros(rows.slots, np.int64)  # tokens each slot's cache holds (prompt + step)
        self.preempted = self.recomputed = 0  # rows queued again, tokens they had made

    def busy(self) -> bool:
        """Rows queued or in flight."""
        return bool(self.queue) or bool((self.occupant >= 0).any())

    def waiting(self) -> set[int]:
        """Prompts with a sample still queued."""
        return {r // self.n for r in self.queue}

    def grow(self) -> list[int]:
        """Cache for every live row's next chunk, the lowest row first; where a shard runs out,
        its youngest rows give theirs back and queue again -> the slots they left."""
        order = sorted(np.flatnonzero(self.occupant >= 0), key=lambda slot: self.occupant[slot])
        requeued, left = [], []
        for slot in order:
            if self.occupant[slot] < 0:
                continue
            want = min(self.held[slot] + self.chunk, self.need[self.occupant[slot]])
            while not self.rows.grow(slot, want):
                shard = self.rows.shard(slot)
                mates = [x for x in order if self.occupant[x] >= 0 and self.rows.shard(x) == shard]
                young = max(mates, key=lambda x: self.occupant[x])  # (this slot itself when it is the youngest)
                row = int(self.occupant[young])
                self.rows.release(young)
                self.recomputed += int(self.held[young] - self.prompt[row // self.n])
                requeued.append(row)
                left.append(int(young))
                self.occupant[young] = -1
                if young == slot:
                    break
        self.queue.extendleft(sorted(requeued, reverse=True))  # (at the front, the lowest first)
        self.preempted += len(requeued)
        return left

    def admit(self) -> tuple[list[int], np.ndarray]:
        """Queued rows into free slots while their prompt and first chunk fit (cache taken here);
        the first that does not fit waits, and those behind it -> (rows, their slots)."""
        free = np.flatnonzero(self.occupant < 0)
        rows = []
        for slot in free:
            if not self.queue:
                break
            row = self.queue[0]
            if not self.rows.grow(slot, min(self.prompt[row // self.n] + self.chunk, self.need[row])):
                break
            rows.append(self.queue.popleft())
        slots = free[: len(rows)]
        self.occupant[slots] = rows
        self.step[slots] = 0
        self.held[slots] = self.prompt[np.asarray(rows, np.int64) // self.n]
        return rows, slots

    def plan(self) -> tuple[np.ndarray, int]:
        """The next chunk's slots idx [R] (the live ones, padded with free slots to a power of
        two; all of them when a paged pool splits over shards: the slots stay with their pools)
        and its window: the cache columns any of them reads or writes in the chunk (the
        furthest row's tokens and next chunk, a power of two of at least 64 tokens, within the
        slot), so a step's cost follows the live rows and tokens, not slots x cache."""
        live = self.occupant >= 0
        window = self.rows.columns(min(self.length, max(64, next_pow2(int(self.held[live].max()) + self.chunk))))
        slots, used = self.rows.slots, np.flatnonzero(live)
        count = slots if self.rows.shards > 1 else min(slots, next_pow2(len(used)))
        if count == slots:
            return np.arange(slots), window
        return np.concatenate([used, np.flatnonzero(~live)])[:count], window

    def advance(self, step, done) -> np.ndarray:
        """The device's step counts [S] and done flags [S] after a chunk -> the slots whose rows
        finished."""
        live = self.occupant >= 0
        self.held += np.where(live, step - self.step, 0)
        self.step = np.array(step, np.int64)
        return np.flatnonzero(done & live)

    def release(self, slots) -> np.ndarray:
        """Free `slots` (their cache back to the row map) -> the rows they held."""
        rows = self.occupant[slots].copy()
        self.occupant[slots] = -1
        for slot in slots:
            self.rows.release(slot)
        return rows
