"""The radix tree's eviction machinery: the lazy heap of candidate leaves, the passes over it,
guard ranks and page trims.

Candidates (unlocked leaves) live in a lazy heap keyed by the eviction order's sort key: a node
is (re)pushed whenever it becomes a candidate or its key changes, and stale entries are skipped
on pop. One evict call costs O(k log n) for k evicted nodes, whatever the cache size (the heap
is rebuilt from the live candidates once it holds more than twice as many entries as the tree
has nodes, plus a constant).

Granularity: "node" (SGLang's) removes whole leaves until at least the asked tokens are free;
"page" frees exactly the pages asked for, trimming them from the end of the least-recent leaf's
edge (the node stays, shorter, with the same sort key). The guard (queue-aware eviction) gives
some leaves a queue rank: they go only when nothing else is evictable, the highest rank first.

`LeafEviction` is a part of `RadixCache` (cache/radix.py), which provides the tree it works on:
root, sort_key, keep, host, page_size, evict_granularity, enable_events, _order, _events,
_evictable, _num_nodes, _heap, _compactions, _child_key and _nodes.
"""
from __future__ import annotations

import heapq
import itertools

import numpy as np

from radixkv.cache.events import EventRun
from radixkv.cache.policies import lru
from radixkv.cache.pool import EMPTY_SLOTS
from radixkv.cache.radix_node import TreeNode, path_key

_versions = itertools.count(1)     # heap-entry versions, unique across nodes: ties never compare nodes


class LeafEviction:
    def _is_candidate(self, n: TreeNode) -> bool:
        return n.lock_ref == 0 and not n.children and n.parent is not None

    def _push(self, n: TreeNode) -> tuple:
        n.hv = next(_versions)            # a split gives a node the id of another's stale entry
        if self.sort_key is lru:          # the default order's key, spelled out: no call
            entry = (n.last_access, n.id, n.hv, n)
        else:
            entry = (*self.sort_key(n), n.hv, n)                    # key..., version, node
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * self._num_nodes + 1024:
            self._rebuild_heap()
        return entry

    def _rebuild_heap(self) -> None:
        """Every candidate, keyed afresh (keys are functions of node state: nothing moves)."""
        self._heap = [(*self.sort_key(c), c.hv, c) for c in self._nodes() if self._is_candidate(c)]
        heapq.heapify(self._heap)
        self._compactions += 1

    def _touch(self, n: TreeNode, now: float) -> None:
        n.last_access = now
        if self._is_candidate(n):
            self._push(n)


    def _evict(self, num_tokens: int) -> np.ndarray:
        ps = self.page_size
        trim = self.evict_granularity == "page"
        need = -(-num_tokens // ps) * ps if trim else num_tokens   # page: whole pages, no more
        freed: list = []
        held: list = []          # guarded leaves popped: (-rank, version, entry, heap epoch)
        total = 0
        while total < need and self._heap:        # not a local alias: _push may compact (replace) it
            entry = heapq.heappop(self._heap)
            n = entry[-1]
            if entry[-2] != n.hv or not self._is_candidate(n):
                continue                          # stale entry
            rank = self.keep(n) if self.keep is not None else None
            if rank is not None:
                held.append((-rank, entry[-2], entry, self._compactions))
                continue
            total, _ = self._evict_entry(entry, need, total, trim, freed)
            if n.parent is not None:              # trimmed: the same entry goes back
                heapq.heappush(self._heap, entry)
        if total < need and held:
            total = self._evict_guarded([h[:3] for h in held], need, total, trim, freed)
        for *_, entry, epoch in held:             # back unchanged (stale ones are skipped later),
            if epoch == self._compactions:        # unless a rebuilt heap holds them already
                heapq.heappush(self._heap, entry)
        return np.concatenate(freed) if freed else EMPTY_SLOTS

    def _evict_guarded(self, held: list, need: int, total: int, trim: bool, freed: list) -> int:
        """Guarded leaves go last, the one whose first waiting user is furthest back in the
        queue (highest rank) first: Belady's order over the part of the future the queue
        shows. A parent exposed here is hit by the same request as its child, so it inherits
        the child's rank unless it has its own (it is in the main heap already, and so is
        every entry `_evict` holds once it is put back: nothing is pushed here)."""
        heapq.heapify(held)
        while total < need and held:
            neg_rank, _, entry = heapq.heappop(held)
            n = entry[-1]
            if entry[-2] != n.hv or not self._is_candidate(n):
                continue
            total, exposed = self._evict_entry(entry, need, total, trim, freed)
            if exposed is not None:
                own = self.keep(exposed[-1])
                rank = -neg_rank if own is None else min(own, -neg_rank)
                heapq.heappush(held, (-rank, exposed[-2], exposed))
        return total

    def _evict_entry(self, entry: tuple, need: int, total: int, trim: bool, freed: list
                     ) -> tuple[int, tuple | None]:
        """Evict the candidate of heap entry `entry`, or (page granularity) trim it to what is
        still needed: its first page, bookkeeping and id stay, so does its sort key, and the
        caller decides where its entry goes. Returns the new total freed and the heap entry
        of the parent when that became a candidate."""
        n = entry[-1]
        L = len(n.key)
        if self.host is not None:                 # the whole path, before any slot is freed
            self.host.demote(path_key(n), self._path_slots(n))
        if trim and L > need - total:
            self._trim(n, L - (need - total), freed)
            return need, None
        if self._order is not None:
            self._order.evicted(n, entry[:-2])
        parent = n.parent
        del parent.children[self._child_key(parent, n.key, 0)]
        n.parent = None
        parent.cv += 1
        self._num_nodes -= 1
        self._evictable -= L
        freed.append(n.value)
        if self.enable_events:
            self._events.append(EventRun("removed", list(n.hashes), None, b"", n.key.namespace))
        exposed = self._push(parent) if self._is_candidate(parent) else None
        return total + L, exposed                 # a dead branch cascades within this call

    def _path_slots(self, n: TreeNode) -> np.ndarray:
        parts = []
        while n.parent is not None:
            parts.append(n.value)
            n = n.parent
        return np.concatenate(parts[::-1])

    def _trim(self, n: TreeNode, keep: int, freed: list) -> None:
        """Drop the pages of leaf `n`'s edge after its first `keep` tokens (a page multiple)."""
        ps = self.page_size
        freed.append(n.value[keep:])
        self._evictable -= len(n.key) - keep
        n.key, n.value = n.key[:keep], n.value[:keep]
        if n.hashes is not None:
            if self.enable_events:
                self._events.append(EventRun("removed", n.hashes[keep // ps:], None, b"",
                                             n.key.namespace))
            del n.hashes[keep // ps:]
        # a pure-read match that ended at `n`, or at its parent partway into this edge, would
        # now answer less: both stamps must go stale
        n.cv += 1
        n.parent.cv += 1
