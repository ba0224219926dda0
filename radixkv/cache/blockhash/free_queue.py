"""The block-hash cache's free queue (vLLM's free block queue, cached part): the blocks at ref
count 0, in the order they got there, head first; the head is evicted first.

Arrays, not a linked list of objects: `log` holds block ids in arrival order and `pos`, per block
id, the index of that block's live entry in `log` (-1: not queued). An entry is live while `pos`
of its block points at it, so taking a block off the queue (a request locks it) only stales its
entry; popping skips stale entries, and the log is compacted when it fills.
"""
from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, np.int64)


class FreeQueue:
    def __init__(self, num_ids: int = 1024):
        self.pos = np.full(num_ids, -1, np.int64)     # per block id: its live entry; -1: none
        self.reset()

    def reset(self) -> None:
        self.pos.fill(-1)
        self.log = np.zeros(1024, np.int64)
        self.at = np.arange(1024)                     # log index -> itself: what a live pos reads
        self.head = self.tail = self.n = 0            # live entries lie in [head, tail); n of them

    def __len__(self) -> int:
        return self.n

    def grow(self, num_ids: int) -> None:
        """Cover block ids up to num_ids - 1."""
        if num_ids > len(self.pos):
            self.pos = np.concatenate([self.pos, np.full(num_ids - len(self.pos), -1, np.int64)])

    def push(self, ids: np.ndarray) -> None:
        """Append blocks (none queued) to the tail, in order."""
        k, t = len(ids), self.tail
        if t + k > len(self.log):                     # compact; grow when half full
            live = self.ids()
            size = max(len(self.log), 2 * (len(live) + k))
            if size > len(self.log):
                self.log, self.at = np.zeros(size, np.int64), np.arange(size)
            self.log[:len(live)] = live
            self.pos[live] = self.at[:len(live)]
            self.head, t = 0, len(live)
        self.log[t:t + k] = ids
        self.pos[ids] = self.at[t:t + k]
        self.tail, self.n = t + k, self.n + k

    def remove(self, ids: np.ndarray) -> None:
        """Take queued blocks off the queue (their entries go stale)."""
        self.pos[ids] = -1
        self.n -= len(ids)

    def pop(self, k: int) -> np.ndarray:
        """Up to k blocks from the head, in order."""
        out, pos = [], self.pos
        while k and self.n:                           # the head's live entries
            h = self.head
            e = min(self.tail, h + max(2 * k, 256))
            seg = self.log[h:e]
            live = np.flatnonzero(pos[seg] == self.at[h:e])
            if len(live) >= k:
                live = live[:k]
                e = h + int(live[-1]) + 1
            self.head = e
            got = seg[live]
            pos[got] = -1
            out.append(got)
            self.n -= len(got)
            k -= len(got)
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else _EMPTY

    def ids(self) -> np.ndarray:
        """The queued blocks, head first."""
        h, t = self.head, self.tail
        seg = self.log[h:t]
        return seg[self.pos[seg] == self.at[h:t]]

    def check(self, cached: np.ndarray, free: np.ndarray, uncached: np.ndarray) -> None:
        """The queue holds exactly `free` (of the `cached` block ids), each once; no `uncached`
        id (a boolean mask) has an entry."""
        assert (self.pos[uncached] == -1).all(), "an uncached block id has a queue entry"
        q = cached[self.pos[cached] != -1]
        pos = self.pos[q]
        assert ((pos >= self.head) & (pos < self.tail)).all() and (self.log[pos] == q).all(), \
            "a queue position points at no entry of its block"
        assert q.tolist() == free.tolist(), \
            "free queue is not exactly the cached blocks with ref_cnt 0"
        assert len(q) == self.n == len(self.ids()), f"free count {self.n} is off"
