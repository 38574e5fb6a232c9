"""`PageTable`: the host's side of a paged KV cache (t2t_jax/models/paged.py): which pages of
the pool each decode slot holds, from a free list per shard of the pool.

    table = PageTable(slots=64, pages=1024, page_size=16, pages_per_slot=512)
    table.grow(slot, tokens)   # -> False when the slot's shard has too few free pages
    table.release(slot)        # the slot's pages back to its shard's free list
    table.table                # [slots, pages_per_slot] int32, what the device reads

Slot s belongs to shard s * shards // slots (the slots split over the mesh's batch axes as the
pool's pages do); page ids are local to a shard, 0 its null page (never handed out).
"""

from __future__ import annotations

import numpy as np


def pages_for(tokens, page_size: int):
    """Pages that hold `tokens` (int or array)."""
    return -(-np.asarray(tokens) // page_size)


class PageTable:
    def __init__(self, slots: int, pages: int, page_size: int, pages_per_slot: int, shards: int = 1):
        if pages % shards or pages // shards < 2:
            raise ValueError(f"rollout.pages ({pages}) must split into {shards} shards of at least 2 pages")
        self.slots, self.shards, self.page_size = slots, shards, page_size
        self.per_shard = pages // shards  # (the null page among them)
        self.free = [list(range(self.per_shard - 1, 0, -1)) for _ in range(shards)]
        self.table = np.zeros((slots, pages_per_slot), np.int32)
        self.held = np.zeros(slots, np.int64)

    def shard(self, slot: int) -> int:
        return slot * self.shards // self.slots

    def capacity(self) -> int:
        """Tokens one slot may hold at most (its table, its shard's pool)."""
        return min(self.table.shape[1], self.per_shard - 1) * self.page_size

    def free_pages(self, slot: int) -> int:
        return len(self.free[self.shard(slot)])

    def grow(self, slot: int, tokens: int) -> bool:
        """Give `slot` pages for `tokens` tokens in all; False (nothing taken) if its shard lacks them."""
        need = int(pages_for(tokens, self.page_size)) - int(self.held[slot])
        if need <= 0:
            return True
        free = self.free[self.shard(slot)]
        if need > len(free) or self.held[slot] + need > self.table.shape[1]:
            return False
        h = int(self.held[slot])
        self.table[slot, h : h + need] = [free.pop() for _ in range(need)]
        self.held[slot] += need
        return True

    def release(self, slot: int) -> None:
        h = int(self.held[slot])
        self.free[self.shard(slot)].extend(self.table[slot, :h][::-1].tolist())
        self.table[slot] = 0
        self.held[slot] = 0

    def in_use(self) -> int:
        """Pages held by all slots."""
        return int(self.held.sum())
