"""Row maps: the host's side of the engine's KV cache, which cache rows each decode slot holds.

    table = PageTable(slots=64, pages=1024, page_size=16, pages_per_slot=512)   # a paged cache
    table.grow(slot, tokens)   # -> False when the slot's shard has too few free pages
    table.release(slot)        # the slot's pages back to its shard's free list
    table.table                # [slots, pages_per_slot] int32, what the device reads
    rows = DenseRows(slots=64, length=8704)                                     # a dense cache

A paged cache (t2t_jax/models/paged.py) is a pool of pages from a free list per shard of the
pool: slot s belongs to shard s * shards // slots (the slots split over the mesh's batch axes as
the pool's pages do); page ids are local to a shard, 0 its null page (never handed out). A dense
cache's slot s is row s of every layer's arrays: `DenseRows` has `PageTable`'s interface with
nothing to hand out, so the engine's scheduler treats both alike.
"""

from __future__ import annotations

import numpy as np


def pages_for(tokens, page_size: int):
    """Pages that hold `tokens` (int or array)."""
    return -(-np.asarray(tokens) // page_size)


class PageTable:
    """The page table of a paged cache: `pages` pages (the null page of each shard among them)
    shared by `slots` slots of up to `pages_per_slot` pages each."""

    def __init__(self, slots: int, pages: int, page_size: int, pages_per_slot: int, shards: int = 1):
        if pages % shards or pages // shards < 2:
            raise ValueError(f"rollout.pages ({pages}) must split into {shards} shards of at least 2 pages")
        self.slots, self.pages, self.shards, self.page_size = slots, pages, shards, page_size
        self.per_shard = pages // shards  # (the null page among them)
        self.free = [list(range(self.per_shard - 1, 0, -1)) for _ in range(shards)]
        self.table = np.zeros((slots, pages_per_slot), np.int32)
        self.held = np.zeros(slots, np.int64)

    def shard(self, slot: int) -> int:
        return slot * self.shards // self.slots

    def capacity(self) -> int:
        """Tokens one slot may hold at most (its table, its shard's pool)."""
        return min(self.table.shape[1], self.per_shard - 1) * self.page_size

    def check(self, tokens: int) -> None:
        """Refuse (ValueError, naming `rollout.pages`) a row that needs `tokens` tokens of cache."""
        if tokens > self.capacity():
            raise ValueError(
                f"rollout.pages: a request needs {tokens} tokens of cache, the pool holds at most "
                f"{self.capacity()} per slot ({self.per_shard - 1} pages of {self.page_size} per shard)"
            )

    def prompt_tokens(self, real, padded: int):
        """Cache tokens a prompt takes in a slot: its real tokens [B] (no padding)."""
        return np.asarray(real, np.int64)

    def columns(self, tokens: int) -> int:
        """Table entries that cover a slot's first `tokens` tokens."""
        return min(self.table.shape[1], int(pages_for(tokens, self.page_size)))

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


class DenseRows:
    """A dense cache's row map (`PageTable`'s interface): slot s is row s, `length` token slots,
    the padded prompt copied in whole; nothing to hand out, so every row fits."""

    shards, pages, table = 1, 0, None  # (no pool, no table: the device's rows are the slots)

    def __init__(self, slots: int, length: int):
        self.slots, self.length = slots, length

    def shard(self, slot: int) -> int:
        return 0

    def capacity(self) -> int:
        return self.length

    def check(self, tokens: int) -> None:
        if tokens > self.length:
            raise ValueError(f"Engine: a request needs {tokens} tokens of cache, a slot holds {self.length}")

    def prompt_tokens(self, real, padded: int):
        """Cache tokens a prompt takes in a slot: the padded length, for every prompt [B]."""
        return np.full(np.shape(real), padded, np.int64)

    def columns(self, tokens: int) -> int:
        return min(self.length, tokens)

    def grow(self, slot: int, tokens: int) -> bool:
        return tokens <= self.length

    def release(self, slot: int) -> None:
        pass

    def in_use(self) -> int:
        return 0
