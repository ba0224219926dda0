"""RadixCache: the RadixAttention radix tree over KV slots.

Each edge carries a run of token ids (a RadixKey slice) and their KV slots; a node boundary is
exactly where two cached sequences stopped agreeing. The tree returns slots and never frees.

Its parts are collaborators that own their state: `LeafEvictor` (cache/radix/evict.py) keeps
the lazy heap of unlocked leaves in the eviction order and chooses what goes: exactly the pages
asked for ("page", the default everywhere) or whole leaves ("node", SGLang's); the tree removes
or trims what it chose. `PinTable` (cache/radix/pins.py: a pin is a lock with a deadline) owns
the caller's clock; an `EventLog` (cache/abilities.py) the KV events; the host tier
(cache/host_tier.py) receives every evicted range before its slots are returned. Stateful
orders live in cache/orders.py; the printout and the structural check in cache/radix/check.py.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import numpy as np

from radixkv.cache.abilities import EventLog, HostStore
from radixkv.cache.base import InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.events import EventRun, chain_run, check_hash_algo
from radixkv.cache.key import TOKEN_BYTES, RadixKey, first_divergence
from radixkv.cache.orders import EvictionOrder
from radixkv.cache.policies import make_sort_key
from radixkv.cache.pool import EMPTY_SLOTS
from radixkv.cache.radix.check import check_tree, render
from radixkv.cache.radix.evict import LeafEvictor
from radixkv.cache.radix.node import TreeNode, is_candidate, node_id, node_ids
from radixkv.cache.radix.pins import PinTable
from radixkv.argcheck import choice

EVICT_GRANULARITIES = ("node", "page")     # what one eviction step removes: a leaf, or pages


class RadixCache(PrefixCache[TreeNode]):
    name = "radix"

    def __init__(self, page_size: int = 1, eviction_policy: str = "lru",
                 clock: Callable[[], float] = time.monotonic, enable_events: bool = False,
                 hash_algo: str = "sha256", evict_granularity: str = "page",
                 max_pinned_tokens: int | None = None, host_tier: HostStore | None = None,
                 **policy_params):
        choice(evict_granularity, "evict granularity", EVICT_GRANULARITIES)
        super().__init__(page_size)
        self.evict_granularity = evict_granularity
        self.clock, self.eviction_policy = clock, eviction_policy
        self.sort_key = make_sort_key(eviction_policy, **policy_params)
        self.order = self.sort_key if isinstance(self.sort_key, EvictionOrder) else None
        self.host = host_tier
        self.pin_table = PinTable(self, max_pinned_tokens)
        self.enable_events, self.hash_algo = enable_events, check_hash_algo(hash_algo)
        self.log = EventLog(self._page_hashes)    # one record per node stored or evicted
        self.evictor = LeafEvictor(self)
        self.view = _TreeView(self)
        self.epoch = -1                           # bumped by reset(): readers holding old nodes can tell
        self.reset()
        self.log.clear()                          # "cleared" is for an explicit reset() only

    # ---- bookkeeping ----------------------------------------------------------------------
    def reset(self) -> None:
        self.epoch += 1
        self.root = TreeNode(RadixKey(), EMPTY_SLOTS, None, self.clock())
        self.root.lock_ref = 1                    # the root is permanently locked
        self._evictable = self._protected = 0
        self._num_nodes = 1
        self.evictor.reset()
        self.pin_table.clear()
        if self.host is not None:
            self.host.reset()
        if self.enable_events:
            self.log.record(EventRun("cleared", []))

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def num_nodes(self) -> int:
        """Nodes in the tree, the root included (a pure read)."""
        return self._num_nodes

    def held_slots(self) -> Iterable[np.ndarray]:
        return (n.value for n in self.nodes() if n is not self.root)

    def pretty_print(self, max_tokens: int = 6) -> str:
        """Print the tree (one line per node) and return the text."""
        text = render(self, max_tokens)
        print(text)
        return text

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str,
                 evict_granularity: str = "page") -> str:
        # the configured default (page) goes unsaid; SGLang's whole-leaf eviction is named
        return f"radix p{page_size} {eviction}" + (" node-evict" if evict_granularity == "node" else "")

    @property
    def label(self) -> str:
        return self.describe(self.page_size, self.eviction_policy, self.hash_algo,
                             self.evict_granularity)

    def child_key(self, parent: TreeNode, key: RadixKey, pos: int):
        """The key `parent.children` holds the edge starting at key[pos:] under."""
        ck = key.page(pos // self.page_size, self.page_size)
        return (key.namespace, ck) if parent is self.root else ck

    def nodes(self) -> Iterable[TreeNode]:
        """Every node, the root first (a pure read)."""
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    # ---- match / split --------------------------------------------------------------------
    def _match(self, key: RadixKey, split: bool) -> MatchResult[TreeNode]:
        # positions in bytes of the packed key (4 per token): one startswith (a memcmp, no
        # copy) per fully matched edge; the hot path of every admission
        pb, kb = self.page_size * TOKEN_BYTES, key.buf
        nb = len(kb)
        now = self.clock() if split else 0.0
        node, pos, parts = self.root, 0, []
        child = node.children.get((key.namespace, kb[:pb])) if pb <= nb else None
        order = self.order
        while child is not None:
            cb = child.key.buf
            L = len(cb)
            if kb.startswith(cb, pos):
                k = L
            else:                                 # diverges inside this edge (or the key ends)
                k = first_divergence(kb[pos:pos + L], cb) * TOKEN_BYTES
                k -= k % pb                       # >= one page: the first page matched
                if not split:                     # pure read: report the partial edge, touch nothing
                    parts.append(child.value[:k // TOKEN_BYTES])
                    pos += k
                    break
                child = self._split(child, k // TOKEN_BYTES)
            if split:
                child.hit_count += 1
                child.last_access = now
                if order is not None:
                    order.hit(child)
                if child.lock_ref == 0 and not child.children:
                    self.evictor.push(child)             # a candidate's sort key changed
            parts.append(child.value)
            pos += k
            node = child
            if k < L or pos + pb > nb:
                break
            child = node.children.get(kb[pos:pos + pb])
        if not parts:
            return MatchResult(0, EMPTY_SLOTS, node)
        slots = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return MatchResult(pos // TOKEN_BYTES, slots, node)

    def node_covering(self, key: RadixKey) -> TreeNode | None:
        """The node whose edge holds the last token of `key` when all of `key` is cached,
        else None. A pure read: nothing is split or touched."""
        key = as_key(key)
        n, node, pos = len(key), self.root, 0
        while pos < n:
            child = node.children.get(self.child_key(node, key, pos))
            if child is None:
                return None
            k = key.shared(child.key, pos)
            if k < min(len(child.key), n - pos):
                return None
            pos += k
            node = child
        return node

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Cut child's edge after k tokens; the new parent inherits the lock count and
        bookkeeping, and the split-off suffix keeps its own access time."""
        parent = child.parent
        assert parent is not None, "the root is never split"
        new = TreeNode(child.key[:k], child.value[:k], parent, child.created)
        new.depth, child.depth = child.depth, child.depth + k
        new.id, child.id = child.id, next(node_ids)   # the prefix keeps the older id (fifo ties)
        new.lock_ref, new.last_access = child.lock_ref, child.last_access
        new.hit_count, new.priority = child.hit_count, child.priority
        new.retain, new.touch = child.retain, child.touch
        new.sig, child.sig = child.sig, None      # one reuse outcome per insertion: the prefix's
        if child.hashes is not None:
            new.hashes, child.hashes = child.hashes[:k // self.page_size], child.hashes[k // self.page_size:]
        ck = self.child_key(parent, child.key, 0)
        parent.children[ck] = new
        parent.cv += 1
        child.key, child.value, child.parent = child.key[k:], child.value[k:], new
        new.children[self.child_key(new, child.key, 0)] = child
        self._num_nodes += 1
        if is_candidate(child):             # the id is part of the sort key: re-key it
            self.evictor.push(child)
        return new

    # ---- insert ---------------------------------------------------------------------------
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag=None
                ) -> InsertResult[TreeNode]:
        ps = self.page_size
        pb, kb = ps * TOKEN_BYTES, key.buf
        A = len(kb) - len(kb) % pb                # bytes; a partial trailing page is not stored
        now = self.clock()
        node, pos, order = self.root, 0, self.order
        while pos < A:
            page = kb[pos:pos + pb]
            child = node.children.get((key.namespace, page) if node is self.root else page)
            if child is None:
                # distinct slots are the pool's guarantee (a per-insert sort would cost ~5x
                # the insert); check_invariants() catches a slot listed twice
                t, e = pos // TOKEN_BYTES, A // TOKEN_BYTES
                new = TreeNode(RadixKey._raw(kb[pos:A], key.namespace), slots[t:e].copy(), node, now)
                new.priority, new.depth = priority, t
                if order is not None:
                    order.created(new, priority, self.pin_table.now, tag)
                node.children[(key.namespace, page) if node is self.root else page] = new
                node.cv += 1
                self._num_nodes += 1
                self._evictable += e - t
                if self.enable_events:
                    self._emit_stored(new)
                self.evictor.push(new)
                return InsertResult(t, new)
            cb = child.key.buf
            L = len(cb)
            if kb.startswith(cb, pos) and pos + L <= A:
                k = L
            else:
                k = min(first_divergence(kb[pos:pos + L], cb) * TOKEN_BYTES, A - pos)
                k -= k % pb
                if k < L:
                    child = self._split(child, k // TOKEN_BYTES)
            if priority > child.priority:
                child.priority = priority
            if order is not None:
                order.used(child, priority, self.pin_table.now, tag)
            child.last_access = now
            if child.lock_ref == 0 and not child.children:
                self.evictor.push(child)
            pos += k
            node = child
        return InsertResult(pos // TOKEN_BYTES, node)

    # ---- locks ----------------------------------------------------------------------------
    def _inc_lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # below the root, a parent
        self.root.lock_ref += 1

    def _check_locked(self, node: TreeNode) -> None:
        # locks taken on this node itself: every lock below it also counts in its lock_ref
        own = node.lock_ref - sum(c.lock_ref for c in node.children.values()) - (node is self.root)
        if own <= 0 and node is self.root:
            raise ValueError("dec_lock_ref on the root, which holds no lock")
        if own <= 0:
            raise ValueError(f"dec_lock_ref on unlocked node {node!r}"
                             + (" (only locks below it hold it)" if node.lock_ref else ""))

    def _dec_lock(self, node: TreeNode) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self.evictor.push(node)
            node = node.parent  # type: ignore[assignment]  # below the root, a parent
        self.root.lock_ref -= 1

    def _check_handle(self, node) -> None:
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode, got {type(node).__name__}")
        top = node
        while top.parent is not None:             # a live node of another tree has a parent too
            top = top.parent
        if top is not self.root:
            raise ValueError(f"{node!r} is not in this tree (evicted or foreign)")

    # ---- eviction: the evictor chooses, the tree removes -----------------------------------
    def _evict(self, num_tokens: int) -> np.ndarray:
        return self.evictor.evict(num_tokens)

    def drop_leaf(self, n: TreeNode) -> np.ndarray:
        """Remove leaf `n` from the tree; returns its slots (the caller frees them)."""
        parent = n.parent
        assert parent is not None and not n.children
        del parent.children[self.child_key(parent, n.key, 0)]
        n.parent = None
        parent.cv += 1
        self._num_nodes -= 1
        self._evictable -= len(n.key)
        if self.enable_events:
            self.log.record(EventRun("removed", list(n.hashes or ()), None, b"", n.key.namespace))
        return n.value

    def trim_leaf(self, n: TreeNode, keep: int) -> np.ndarray:
        """Drop the pages of leaf `n`'s edge after its first `keep` tokens (a page multiple);
        returns their slots."""
        ps, freed = self.page_size, n.value[keep:]
        self._evictable -= len(n.key) - keep
        n.key, n.value = n.key[:keep], n.value[:keep]
        if n.hashes is not None:
            if self.enable_events:
                self.log.record(EventRun("removed", n.hashes[keep // ps:], None, b"",
                                         n.key.namespace))
            del n.hashes[keep // ps:]
        # a pure-read match that ended at `n`, or at its parent partway into this edge, would
        # now answer less: both stamps must go stale
        n.cv += 1
        assert n.parent is not None
        n.parent.cv += 1
        return freed

    def edge_below(self, node: TreeNode, key: RadixKey, depth: int) -> TreeNode | None:
        """The child of `node` whose edge holds key[depth:], or None (a pure read)."""
        if depth + self.page_size > len(key):
            return None
        return node.children.get(self.child_key(node, key, depth))

    # ---- checks -----------------------------------------------------------------------------
    def _check_structure(self) -> None:
        check_tree(self)

    def _locks_held(self) -> int:
        # every lock passes through the root once; pins hold theirs, not requests
        return self.root.lock_ref - 1 - self.pin_table.locks()

    def _lock_units(self, node: TreeNode) -> int:
        return 1

    def num_entries(self) -> int:
        return self._num_nodes

    def stats(self) -> dict[str, int]:
        out = {"entries": self._num_nodes, "pinned_tokens": self.pin_table.pinned_size(),
               "pins": len(self.pin_table), "pins_refused": self.pin_table.refused}
        return out | (self.host.stats() if self.host is not None else {})

    # ---- abilities (cache/abilities.py) -----------------------------------------------------
    def events(self) -> EventLog | None:
        return self.log if self.enable_events else None

    def pins(self) -> PinTable:
        return self.pin_table

    def tree(self) -> _TreeView:
        return self.view

    def guard(self) -> LeafEvictor:
        return self.evictor

    def admission(self) -> _TreeView:
        return self.view

    def host_tier(self) -> HostStore | None:
        return self.host

    # ---- events -----------------------------------------------------------------------------
    def _emit_stored(self, n: TreeNode) -> None:
        ns, kb = n.key.namespace, n.key.buf
        assert n.parent is not None
        parent_hash = n.parent.hashes[-1] if n.parent.hashes else None
        hashes = chain_run(parent_hash, ns, kb, self.page_size, self.hash_algo)
        n.hashes = hashes.copy()                  # the node's own: a trim shortens it in place
        self.log.record(EventRun("stored", hashes, parent_hash, kb, ns))

    def _page_hashes(self) -> set[int]:
        return {h for n in self.nodes() if n is not self.root for h in (n.hashes or ())}


class _TreeView:
    """The tree read only (abilities.TreeView) and the pure reads an admission decides on
    (abilities.Admission)."""

    def __init__(self, tree: RadixCache):
        self._t = tree

    def root(self) -> TreeNode:
        return self._t.root

    def parent(self, node: TreeNode) -> TreeNode | None:
        return node.parent

    def children(self, node: TreeNode) -> list[TreeNode]:
        return sorted(node.children.values(), key=node_id)

    def stamp(self, node: TreeNode) -> Any:
        return (self._t.epoch, node.cv)

    def still_valid(self, node: TreeNode, stamp: Any) -> bool:
        # a match can only change where it ended: when that node was evicted (or the cache
        # reset), or its children changed
        return (stamp[0] == self._t.epoch and stamp[1] == node.cv
                and (node.parent is not None or node is self._t.root))

    def lock_cost(self, key: RadixKey, node: TreeNode, prefix_len: int) -> int:
        # unlocked nodes on the path, plus the part of a partly matched edge below `node`
        # (a pure read stops at the parent of the edge a splitting match would cut)
        t = self._t
        depth = node.depth + len(node.key)
        cost, n = 0, node
        while n.parent is not None:
            cost += len(n.key) if n.lock_ref == 0 else 0
            n = n.parent
        if prefix_len > depth:
            child = t.edge_below(node, key, depth)
            cost += prefix_len - depth if child is not None and child.lock_ref == 0 else 0
        return cost
