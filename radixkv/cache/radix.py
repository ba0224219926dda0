"""RadixCache: the RadixAttention radix tree over KV slots.

Each edge carries a run of token ids (a RadixKey slice) and their KV slots; a node boundary is
exactly where two cached sequences stopped agreeing. The tree returns slots and never frees.

Eviction (cache/radix_evict.py) removes unlocked leaves from a lazy heap keyed by the eviction
order, O(k log n) for k nodes: whole leaves ("node", SGLang's) or exactly the pages asked for
("page", the configured default), trimmed from the end of the least-recent leaf.

Operator controls, each off by default and kept in its own module: pinned prefixes
(cache/pins.py: a pin is a lock with a deadline), stateful orders (cache/orders.py: `cost`,
`retention`, `reuse`), an eviction guard (leaves it gives a queue rank go only when nothing
else is evictable, the highest rank first: the manager's queue-aware eviction), and a host
tier (cache/host_tier.py) that receives every evicted range before its slots are returned.
Inspection and `check_invariants` live in cache/radix_check.py.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

import numpy as np

from radixkv.cache.base import HostStore, InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.events import EventRun, KVEvent, chain_run, check_hash_algo, run_pages
from radixkv.cache.key import TOKEN_BYTES, RadixKey, first_divergence
from radixkv.cache.orders import EvictionOrder
from radixkv.cache.pins import PinTable
from radixkv.cache.policies import make_sort_key
from radixkv.cache.pool import EMPTY_SLOTS
from radixkv.cache.radix_check import TreeChecks
from radixkv.cache.radix_evict import LeafEviction
from radixkv.cache.radix_node import TreeNode, node_id, node_ids
from radixkv.argcheck import choice

EVICT_GRANULARITIES = ("node", "page")     # what one eviction step removes: a leaf, or pages

class RadixCache(TreeChecks, LeafEviction, PrefixCache):
    name = "radix"

    def __init__(self, page_size: int = 1, eviction_policy: str = "lru",
                 clock: Callable[[], float] = time.monotonic, enable_events: bool = False,
                 hash_algo: str = "sha256", evict_granularity: str = "node",
                 max_pinned_tokens: int | None = None, host_tier: HostStore | None = None,
                 **policy_params):
        choice(evict_granularity, "evict granularity", EVICT_GRANULARITIES)
        super().__init__(page_size)
        self.evict_granularity = evict_granularity
        self.clock, self.eviction_policy = clock, eviction_policy
        self.sort_key = make_sort_key(eviction_policy, **policy_params)
        self._order = self.sort_key if isinstance(self.sort_key, EvictionOrder) else None
        self.keep: Callable[[TreeNode], int | None] | None = None     # the eviction guard
        self.host = host_tier
        self.now = 0.0                            # the caller's time (advance): pins, retention
        self.pins = PinTable(self, max_pinned_tokens)
        self.enable_events, self.hash_algo = enable_events, check_hash_algo(hash_algo)
        self._events: list[EventRun] = []         # one record per node stored or evicted
        self.epoch = -1                           # bumped by reset(): readers holding old nodes can tell
        self.reset()
        self._events.clear()                      # "cleared" is for an explicit reset() only

    # ---- bookkeeping ----------------------------------------------------------------------
    def reset(self) -> None:
        self.epoch += 1
        self.root = TreeNode(RadixKey(), EMPTY_SLOTS, None, self.clock())
        self.root.lock_ref = 1                    # the root is permanently locked
        self._evictable = self._protected = 0
        self._num_nodes = 1
        self._heap: list = []
        self._compactions = 0                     # heap rebuilds so far (entries held in _evict)
        self.pins.clear()
        if self.host is not None:
            self.host.reset()
        if self.enable_events:
            self._events.append(EventRun("cleared", []))

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def num_nodes(self) -> int:
        return self._num_nodes

    num_entries = num_nodes

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str,
                 evict_granularity: str = "node") -> str:
        # the configured default (page) goes unsaid; SGLang's whole-leaf eviction is named
        return f"radix p{page_size} {eviction}" + (" node-evict" if evict_granularity == "node" else "")

    @property
    def label(self) -> str:
        return self.describe(self.page_size, self.eviction_policy, self.hash_algo,
                             self.evict_granularity)

    def _child_key(self, parent: TreeNode, key: RadixKey, pos: int):
        ck = key.page(pos // self.page_size, self.page_size)
        return (key.namespace, ck) if parent is self.root else ck

    def _nodes(self) -> Iterable[TreeNode]:
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    # ---- match / split --------------------------------------------------------------------
    def _match(self, key: RadixKey, split: bool) -> MatchResult:
        # positions in bytes of the packed key (4 per token): one startswith (a memcmp, no
        # copy) per fully matched edge; the hot path of every admission
        pb, kb = self.page_size * TOKEN_BYTES, key.buf
        nb = len(kb)
        now = self.clock() if split else 0.0
        node, pos, parts = self.root, 0, []
        child = node.children.get((key.namespace, kb[:pb])) if pb <= nb else None
        order = self._order
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
                    self._push(child)             # a candidate's sort key changed
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
            child = node.children.get(self._child_key(node, key, pos))
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
        new = TreeNode(child.key[:k], child.value[:k], parent, child.created)
        new.depth, child.depth = child.depth, child.depth + k
        new.id, child.id = child.id, next(node_ids)   # the prefix keeps the older id (fifo ties)
        new.lock_ref, new.last_access = child.lock_ref, child.last_access
        new.hit_count, new.priority = child.hit_count, child.priority
        new.retain, new.touch = child.retain, child.touch
        new.sig, child.sig = child.sig, None      # one reuse outcome per insertion: the prefix's
        if child.hashes is not None:
            new.hashes, child.hashes = child.hashes[:k // self.page_size], child.hashes[k // self.page_size:]
        ck = self._child_key(parent, child.key, 0)
        parent.children[ck] = new
        parent.cv += 1
        child.key, child.value, child.parent = child.key[k:], child.value[k:], new
        new.children[self._child_key(new, child.key, 0)] = child
        self._num_nodes += 1
        if self._is_candidate(child):             # the id is part of the sort key: re-key it
            self._push(child)
        return new

    # ---- insert ---------------------------------------------------------------------------
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag=None
                ) -> InsertResult:
        ps = self.page_size
        pb, kb = ps * TOKEN_BYTES, key.buf
        A = len(kb) - len(kb) % pb                # bytes; a partial trailing page is not stored
        now = self.clock()
        node, pos, order = self.root, 0, self._order
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
                    order.created(new, priority, self.now, tag)
                node.children[(key.namespace, page) if node is self.root else page] = new
                node.cv += 1
                self._num_nodes += 1
                self._evictable += e - t
                if self.enable_events:
                    self._emit_stored(new)
                self._push(new)
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
                order.used(child, priority, self.now, tag)
            child.last_access = now
            if child.lock_ref == 0 and not child.children:
                self._push(child)
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
            node = node.parent
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
                    self._push(node)
            node = node.parent
        self.root.lock_ref -= 1

    def _check_handle(self, node) -> None:
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode, got {type(node).__name__}")
        top = node
        while top.parent is not None:             # a live node of another tree has a parent too
            top = top.parent
        if top is not self.root:
            raise ValueError(f"{node!r} is not in this tree (evicted or foreign)")

    # ---- capabilities -----------------------------------------------------------------------
    def match_stamp(self, node: TreeNode):
        return (self.epoch, node.cv)

    def match_valid(self, node: TreeNode, stamp) -> bool:
        # a match can only change where it ended: when that node was evicted (or the cache
        # reset), or its children changed
        return (stamp[0] == self.epoch and stamp[1] == node.cv
                and (node.parent is not None or node is self.root))

    def lock_cost(self, key: RadixKey, node: TreeNode, prefix_len: int) -> int:
        # unlocked nodes on the path, plus the part of a partly matched edge below `node`
        # (a pure read stops at the parent of the edge a splitting match would cut)
        depth = node.depth + len(node.key)
        cost, n = 0, node
        while n is not self.root:
            cost += len(n.key) if n.lock_ref == 0 else 0
            n = n.parent
        if prefix_len > depth:
            child = self.edge_below(node, key, depth)
            cost += prefix_len - depth if child is not None and child.lock_ref == 0 else 0
        return cost

    def locks_held(self) -> int:
        # every lock passes through the root once; pins hold theirs, not requests
        return self.root.lock_ref - 1 - self.pins.locks()

    def edge_below(self, node: TreeNode, key: RadixKey, depth: int) -> TreeNode | None:
        """The child of `node` whose edge holds key[depth:], or None (a pure read)."""
        if depth + self.page_size > len(key):
            return None
        return node.children.get(self._child_key(node, key, depth))

    def hit_handles(self, key: RadixKey, node: TreeNode, prefix_len: int) -> list[TreeNode]:
        depth = node.depth + len(node.key)
        out = [] if node is self.root else [node]
        child = self.edge_below(node, key, depth) if prefix_len > depth else None
        return out + ([child] if child is not None else [])

    # ---- operator controls: time, pins, the eviction guard, the host tier ------------------
    def advance(self, now: float) -> None:
        self.now = max(self.now, float(now))
        self.pins.expire(self.now)

    def _pin(self, key: RadixKey, ttl: float) -> int:
        return self.pins.pin(key, ttl, self.now)

    def _unpin(self, key: RadixKey) -> int:
        return self.pins.unpin(key)

    def pinned_size(self) -> int:
        return self.pins.pinned_size()

    def default_pin_budget(self, tokens: int) -> None:
        if self.pins.budget is None:
            self.pins.budget = int(tokens)

    def set_eviction_guard(self, keep) -> None:
        self.keep = keep

    def host_tier(self) -> HostStore | None:
        return self.host

    def stats(self) -> dict[str, int]:
        out = {"pinned_tokens": self.pinned_size(), "pins": len(self.pins),
               "pins_refused": self.pins.refused}
        return out | (self.host.stats() if self.host is not None else {})

    def lock_units(self, node: TreeNode) -> int:
        return 1

    def tree_root(self) -> TreeNode:
        return self.root

    def tree_children(self, node: TreeNode) -> list[TreeNode]:
        return sorted(node.children.values(), key=node_id)

    def tree_parent(self, node: TreeNode) -> TreeNode | None:
        return node.parent

    # ---- events ---------------------------------------------------------------------------
    def _emit_stored(self, n: TreeNode) -> None:
        ns, kb = n.key.namespace, n.key.buf
        parent_hash = n.parent.hashes[-1] if n.parent.hashes else None
        hashes = chain_run(parent_hash, ns, kb, self.page_size, self.hash_algo)
        n.hashes = hashes.copy()                  # the node's own: a trim shortens it in place
        self._events.append(EventRun("stored", hashes, parent_hash, kb, ns))

    def take_events(self) -> list[KVEvent]:
        return run_pages(self.take_event_runs())

    def take_event_runs(self) -> list[EventRun]:
        ev, self._events = self._events, []
        return ev

    def _page_hashes(self) -> set[int]:
        return {h for n in self._nodes() if n is not self.root for h in n.hashes}

def _demo() -> None:
    from radixkv.cache.pool import SlotPool

    pool, tree = SlotPool(64), RadixCache()
    for seq in ([1, 2, 3], [1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 5, 6, 7], [8, 9, 10, 11, 12]):
        slots = pool.alloc(len(seq))
        res = tree.insert(RadixKey(seq), slots)
        pool.free(slots[:res.prefix_len])         # duplicates go back to the pool
        print(f"insert {seq}: {res.prefix_len} already cached, {len(seq) - res.prefix_len} stored")
    tree.pretty_print()
    query = [1, 2, 3, 13, 14]
    m = tree.match_prefix(RadixKey(query))
    print(f"match {query}: prefix_len={m.prefix_len} matched={query[:m.prefix_len]} "
          f"slots={m.slots.tolist()}")
    tree.check_invariants()
    pool.check_conservation(tree.held_slots())


if __name__ == "__main__":
    _demo()
