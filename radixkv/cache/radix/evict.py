"""The radix tree's eviction order: `LeafEvictor`, a collaborator of RadixCache that owns the
lazy heap of candidate leaves, its compactions and the eviction guard, and chooses what goes;
the tree (cache/radix/tree.py) removes or trims what it chose.

Candidates (unlocked leaves) live in a lazy heap keyed by the eviction order's sort key: a node
is (re)pushed whenever it becomes a candidate or its key changes, and stale entries are skipped
on pop. One evict call costs O(k log n) for k evicted nodes, whatever the cache size (the heap
is rebuilt from the live candidates once it holds more than twice as many entries as the tree
has nodes, plus a constant).

Granularity: "node" (SGLang's) removes whole leaves until at least the asked tokens are free;
"page" frees exactly the pages asked for, trimming them from the end of the least-recent leaf's
edge (the node stays, shorter, with the same sort key). The guard (queue-aware eviction) gives
some leaves a queue rank: they go only when nothing else is evictable, the highest rank first.
"""
from __future__ import annotations

import builtins
import heapq
import itertools

import numpy as np

from typing import Any, Callable

from radixkv.cache.key import RadixKey
from radixkv.cache.policies import lru
from radixkv.cache.pool import EMPTY_SLOTS
from radixkv.cache.radix.node import TreeNode, is_candidate, path_key, path_slots

_versions = itertools.count(1)     # heap-entry versions, unique across nodes: ties never compare nodes


class LeafEvictor:
    def __init__(self, tree: Any):
        # the tree (cache/radix/tree.py) it chooses for: its root, sizes, order and host tier,
        # and drop_leaf / trim_leaf, which remove what was chosen
        self.tree = tree
        self.sort_key = tree.sort_key
        self.keep: Callable[[TreeNode], int | None] | None = None     # the eviction guard
        self.reset()

    def reset(self) -> None:
        self.heap: list = []
        self.compactions = 0                      # heap rebuilds so far (entries held in evict)

    # ---- the guard (abilities.EvictionGuard) ----------------------------------------------
    def set(self, keep: Callable[[TreeNode], int | None] | None) -> None:
        self.keep = keep

    def hit_handles(self, key: RadixKey, node: TreeNode, prefix_len: int) -> list[TreeNode]:
        depth = node.depth + len(node.key)
        out = [] if node is self.tree.root else [node]
        child = self.tree.edge_below(node, key, depth) if prefix_len > depth else None
        return out + ([child] if child is not None else [])

    # ---- the heap ---------------------------------------------------------------------------
    def push(self, n: TreeNode) -> tuple:
        n.hv = next(_versions)            # a split gives a node the id of another's stale entry
        if self.sort_key is lru:          # the default order's key, spelled out: no call
            entry = (n.last_access, n.id, n.hv, n)
        else:
            entry = (*self.sort_key(n), n.hv, n)                    # key..., version, node
        heapq.heappush(self.heap, entry)
        if len(self.heap) > 2 * self.tree.num_nodes() + 1024:
            self._rebuild()
        return entry

    def _rebuild(self) -> None:
        """Every candidate, keyed afresh (keys are functions of node state: nothing moves)."""
        self.heap = [(*self.sort_key(c), c.hv, c) for c in self.tree.nodes() if is_candidate(c)]
        heapq.heapify(self.heap)
        self.compactions += 1

    def live(self) -> builtins.set[int]:       # builtins: `set` below is a method
        """ids of the nodes with a live heap entry (for the tree's check)."""
        return {id(e[-1]) for e in self.heap if e[-2] == e[-1].hv}

    # ---- evict ------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> np.ndarray:
        ps = self.tree.page_size
        trim = self.tree.evict_granularity == "page"
        need = -(-num_tokens // ps) * ps if trim else num_tokens   # page: whole pages, no more
        freed: list = []
        held: list = []          # guarded leaves popped: (-rank, version, entry, heap epoch)
        total = 0
        while total < need and self.heap:         # not a local alias: push may compact (replace) it
            entry = heapq.heappop(self.heap)
            n = entry[-1]
            if entry[-2] != n.hv or not is_candidate(n):
                continue                          # stale entry
            rank = self.keep(n) if self.keep is not None else None
            if rank is not None:
                held.append((-rank, entry[-2], entry, self.compactions))
                continue
            total, _ = self._evict_entry(entry, need, total, trim, freed)
            if n.parent is not None:              # trimmed: the same entry goes back
                heapq.heappush(self.heap, entry)
        if total < need and held:
            total = self._evict_guarded([h[:3] for h in held], need, total, trim, freed)
        for *_, entry, epoch in held:             # back unchanged (stale ones are skipped later),
            if epoch == self.compactions:         # unless a rebuilt heap holds them already
                heapq.heappush(self.heap, entry)
        return np.concatenate(freed) if freed else EMPTY_SLOTS

    def _evict_guarded(self, held: list, need: int, total: int, trim: bool, freed: list) -> int:
        """Guarded leaves go last, the one whose first waiting user is furthest back in the
        queue (highest rank) first: Belady's order over the part of the future the queue
        shows. A parent exposed here is hit by the same request as its child, so it inherits
        the child's rank unless it has its own (it is in the main heap already, and so is
        every entry `evict` holds once it is put back: nothing is pushed here)."""
        assert self.keep is not None              # only guarded leaves are held
        heapq.heapify(held)
        while total < need and held:
            neg_rank, _, entry = heapq.heappop(held)
            n = entry[-1]
            if entry[-2] != n.hv or not is_candidate(n):
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
        n, tree = entry[-1], self.tree
        L = len(n.key)
        if tree.host is not None:                 # the whole path, before any slot is freed
            tree.host.demote(path_key(n), path_slots(n))
        if trim and L > need - total:
            freed.append(tree.trim_leaf(n, L - (need - total)))
            return need, None
        if tree.order is not None:
            tree.order.evicted(n, entry[:-2])
        parent = n.parent
        freed.append(tree.drop_leaf(n))
        exposed = self.push(parent) if is_candidate(parent) else None
        return total + L, exposed                 # a dead branch cascades within this call
