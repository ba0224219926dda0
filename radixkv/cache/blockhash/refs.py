"""The block-hash cache's reference counts: `RefCounts` owns, per block id, its count and the
free queue of the cached blocks at count 0 (cache/blockhash/free_queue.py), so a block joins
the queue's tail exactly when its last reference goes. A handle's blocks are locked and
unlocked together: a Chain in a few vectorised steps, a hand-made tuple of Blocks one block
at a time, exactly as listed."""
from __future__ import annotations

import numpy as np

from radixkv.cache.blockhash.free_queue import FreeQueue
from radixkv.cache.blockhash.handles import Chain


class RefCounts:
    def __init__(self, num_ids: int = 1024):
        self.ref = np.zeros(num_ids, np.int32)
        self.queue = FreeQueue(num_ids)

    def reset(self) -> None:
        self.ref.fill(0)
        self.queue.reset()

    def grow(self, num_ids: int) -> None:
        """Cover block ids up to num_ids - 1."""
        if num_ids > len(self.ref):
            self.ref = np.concatenate([self.ref, np.zeros(num_ids - len(self.ref), np.int32)])
            self.queue.grow(num_ids)

    def held(self) -> int:
        """References outstanding: one per block of each locked handle."""
        return int(self.ref.sum())

    def unreferenced(self, ids: np.ndarray) -> int:
        """How many of `ids` are at count 0 (in the free queue: evictable until locked)."""
        return int((self.ref[ids] == 0).sum())

    # ---- handles -----------------------------------------------------------------------------
    @staticmethod
    def _runs(chain) -> list[np.ndarray]:
        """The id arrays a checked handle is locked or unlocked in, in order: a Chain's blocks
        are distinct, one vectorised step; a hand-made tuple may list a block twice, so it
        goes one block at a time."""
        if isinstance(chain, Chain):
            return [chain.ids]
        return [np.array([b.id], np.int64) for b in chain or ()]

    def inc(self, chain) -> None:
        for ids in self._runs(chain):
            self.lock(ids)

    def lock(self, ids: np.ndarray) -> None:
        ref = self.ref[ids]
        self.queue.remove(ids[ref == 0])          # their queue entries go stale
        self.ref[ids] = ref + 1

    def relock(self, old, new) -> None:
        # a chain extending the one it replaces: its shared blocks keep their count (+1 - 1,
        # never reaching 0), so only the blocks past the old chain are locked
        if isinstance(old, Chain) and isinstance(new, Chain) and len(old) <= len(new) \
                and (new.ids[:len(old)] == old.ids).all():
            self.lock(new.ids[len(old):])
            return
        self.inc(new)
        self.dec(old)

    def check_locked(self, chain) -> None:
        """Raise ValueError unless dec(chain) can undo a lock."""
        if isinstance(chain, Chain) and (self.ref[chain.ids] > 0).all():
            return
        seen: dict[int, int] = {}
        for b in chain or ():                     # a block listed k times needs k refs
            seen[b.id] = seen.get(b.id, 0) + 1
            if self.ref[b.id] < seen[b.id]:
                raise ValueError(f"dec_lock_ref on unreferenced {b!r}")

    def dec(self, chain) -> None:
        for ids in reversed(self._runs(chain)):
            rev = ids[::-1]                       # last block reaches the tail first
            ref = self.ref[rev] - 1
            self.ref[rev] = ref
            self.queue.push(rev[ref == 0])

    def check(self, cached: np.ndarray, uncached_mask: np.ndarray) -> None:
        """Counts never negative, none on an uncached id, and the queue exactly the cached
        blocks at count 0, each once."""
        assert (self.ref >= 0).all(), f"negative ref count at block {int(np.argmin(self.ref))}"
        assert not self.ref[uncached_mask].any(), "an uncached block id has a ref count"
        self.queue.check(cached, cached[self.ref[cached] == 0], uncached_mask)
