"""RadixCache: the RadixAttention radix tree over KV slots.

Each edge carries a run of token ids (a RadixKey slice) and their KV slots; a node boundary is
exactly where two cached sequences stopped agreeing. The tree returns slots and never frees.

Eviction candidates (unlocked leaves) live in a lazy heap keyed by the eviction policy's sort
key: a node is (re)pushed whenever it becomes a candidate or its key changes, and stale
entries are skipped on pop. One evict call costs O(k log n) for k evicted nodes, whatever
the cache size (the heap is rebuilt from the live candidates once it holds more than twice
as many entries as the tree has nodes, plus a constant).
"""
from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Iterable

import numpy as np

from radixkv.cache.base import InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.events import HASH_ALGOS, KVEvent, chain_hash
from radixkv.cache.key import TOKEN_BYTES, RadixKey, first_divergence
from radixkv.cache.policies import make_sort_key
from radixkv.cache.pool import EMPTY_SLOTS, as_slots

_ITEM = TOKEN_BYTES
_ids = itertools.count()
_versions = itertools.count(1)     # heap-entry versions, unique across nodes: ties never compare nodes


class TreeNode:
    __slots__ = ("id", "key", "value", "parent", "children", "lock_ref", "last_access",
                 "created", "hit_count", "priority", "hashes", "hv", "cv")

    def __init__(self, key: RadixKey, value: np.ndarray, parent: "TreeNode | None", now: float):
        self.id = next(_ids)
        self.key, self.value, self.parent = key, value, parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = self.created = now
        self.hit_count = self.priority = 0
        self.hashes: list[int] | None = None      # one chained hash per page (events on)
        self.hv = 0                               # version of this node's live heap entry
        self.cv = 0                               # bumped whenever `children` changes

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


class RadixCache(PrefixCache):
    def __init__(self, page_size: int = 1, eviction_policy: str = "lru",
                 clock: Callable[[], float] = time.monotonic, enable_events: bool = False,
                 disable: bool = False, hash_algo: str = "sha256", **policy_params):
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size, self.clock, self.disable = page_size, clock, disable
        self.eviction_policy = eviction_policy
        self.sort_key = make_sort_key(eviction_policy, **policy_params)
        if hash_algo not in HASH_ALGOS:
            raise ValueError(f"unknown hash {hash_algo!r}; valid: {', '.join(HASH_ALGOS)}")
        self.enable_events, self.hash_algo = enable_events, hash_algo
        self._events: list[KVEvent] = []
        self.reset()
        self._events.clear()                      # "cleared" is for an explicit reset() only

    # ---- bookkeeping ----------------------------------------------------------------------
    def reset(self) -> None:
        self.epoch = getattr(self, "epoch", -1) + 1    # readers holding old nodes can tell
        self.root = TreeNode(RadixKey(), EMPTY_SLOTS, None, self.clock())
        self.root.lock_ref = 1                    # the root is permanently locked
        self._evictable = self._protected = 0
        self._num_nodes = 1
        self._heap: list = []
        if self.enable_events:
            self._events.append(KVEvent("cleared"))

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def num_nodes(self) -> int:
        return self._num_nodes

    def _child_key(self, parent: TreeNode, key: RadixKey, pos: int):
        ck = key.buf[pos * _ITEM:(pos + self.page_size) * _ITEM]
        return (key.namespace, ck) if parent is self.root else ck

    def _is_candidate(self, n: TreeNode) -> bool:
        return n.lock_ref == 0 and not n.children and n.parent is not None

    def _push(self, n: TreeNode) -> None:
        n.hv = next(_versions)            # a split gives a node the id of another's stale entry
        heapq.heappush(self._heap, (*self.sort_key(n), n.hv, n))   # key..., version, node
        if len(self._heap) > 2 * self._num_nodes + 1024:
            self._heap = [(*self.sort_key(c), c.hv, c) for c in self._nodes() if self._is_candidate(c)]
            heapq.heapify(self._heap)

    def _touch(self, n: TreeNode, now: float) -> None:
        n.last_access = now
        if self._is_candidate(n):
            self._push(n)

    def _nodes(self) -> Iterable[TreeNode]:
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    # ---- match / split --------------------------------------------------------------------
    def match_prefix(self, key: RadixKey, split: bool = True) -> MatchResult:
        key = as_key(key)
        if self.disable:
            return MatchResult(0, EMPTY_SLOTS, self.root)
        ps, buf = self.page_size, key.buf
        pb, nb = ps * _ITEM, len(buf)             # byte offsets: one page, the whole key
        now = self.clock() if split else 0.0
        node, pos, parts = self.root, 0, []       # pos counts bytes here
        child = node.children.get((key.namespace, buf[:pb])) if pb <= nb else None
        while child is not None:
            eb = child.key.buf
            end = pos + len(eb)
            if buf[pos:end] == eb:
                k = len(eb)
            else:                                 # diverges inside this edge (or key ends)
                k = first_divergence(buf[pos:end], eb) * _ITEM
                k -= k % pb                       # >= one page: the first page matched
                if not split:                     # pure read: report the partial edge, touch nothing
                    parts.append(child.value[:k // _ITEM])
                    pos += k
                    break
                child = self._split(child, k // _ITEM)
            if split:
                child.hit_count += 1
                child.last_access = now
                if child.lock_ref == 0 and not child.children:
                    self._push(child)             # a candidate's sort key changed
            parts.append(child.value)
            pos += k
            node = child
            if k < len(eb) or pos + pb > nb:
                break
            child = node.children.get(buf[pos:pos + pb])
        if not parts:
            return MatchResult(0, EMPTY_SLOTS, node)
        slots = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return MatchResult(pos // _ITEM, slots, node)

    def node_covering(self, key: RadixKey) -> TreeNode | None:
        """The node whose edge holds the last token of `key` when all of `key` is cached,
        else None. A pure read: nothing is split or touched."""
        key = as_key(key)
        buf, nb, node, pos = key.buf, len(key.buf), self.root, 0
        if nb == 0:
            return self.root
        while pos < nb:
            child = node.children.get((key.namespace, buf[:_ITEM * self.page_size]) if node is self.root
                                      else buf[pos:pos + _ITEM * self.page_size])
            if child is None:
                return None
            eb = child.key.buf
            seg = buf[pos:pos + len(eb)]
            if seg != eb[:len(seg)]:
                return None
            pos += len(seg)
            node = child
        return node

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Cut child's edge after k tokens; the new parent inherits the lock count and
        bookkeeping, and the split-off suffix keeps its own access time."""
        parent = child.parent
        new = TreeNode(child.key[:k], child.value[:k], parent, child.created)
        new.id, child.id = child.id, next(_ids)   # the prefix keeps the older id (fifo ties)
        new.lock_ref, new.last_access = child.lock_ref, child.last_access
        new.hit_count, new.priority = child.hit_count, child.priority
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
    def insert(self, key: RadixKey, slots, priority: int = 0) -> InsertResult:
        key = as_key(key)
        slots = as_slots(slots)
        if len(slots) != len(key):
            raise ValueError(f"insert got {len(slots)} slots for {len(key)} tokens")
        if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if slots.size and slots.min() < 0:
            raise ValueError(f"slot {int(slots.min())} is negative")
        if self.disable:
            return InsertResult(0, self.root)
        ps = self.page_size
        A = len(key) - len(key) % ps              # a partial trailing page is not stored
        now = self.clock()
        node, pos = self.root, 0
        while pos < A:
            child = node.children.get(self._child_key(node, key, pos))
            if child is None:
                # distinct slots are the pool's guarantee (a per-insert sort would cost ~5x
                # the insert); check_invariants() catches a slot listed twice
                new = TreeNode(key[pos:A], slots[pos:A].copy(), node, now)
                new.priority = priority
                node.children[self._child_key(node, key, pos)] = new
                node.cv += 1
                self._num_nodes += 1
                self._evictable += A - pos
                if self.enable_events:
                    self._emit_stored(new)
                self._push(new)
                return InsertResult(pos, new)
            eb = child.key.buf
            L = len(eb) // _ITEM
            k = min(L, A - pos)
            seg = key.buf[pos * _ITEM:(pos + k) * _ITEM]
            if seg != eb[:k * _ITEM]:
                k = first_divergence(seg, eb)
            k -= k % ps
            if k < L:
                child = self._split(child, k)
            child.priority = max(child.priority, priority)
            self._touch(child, now)
            pos += k
            node = child
        return InsertResult(pos, node)

    # ---- evict ----------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> np.ndarray:
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0:
            raise ValueError(f"evict needs a non-negative int, got {num_tokens!r}")
        freed, total = [], 0
        while total < num_tokens and self._heap:  # not a local alias: _push may compact (replace) it
            *_, hv, n = heapq.heappop(self._heap)
            if hv != n.hv or not self._is_candidate(n):
                continue                          # stale entry
            parent = n.parent
            del parent.children[self._child_key(parent, n.key, 0)]
            n.parent = None
            parent.cv += 1
            self._num_nodes -= 1
            self._evictable -= len(n.key)
            total += len(n.key)
            freed.append(n.value)
            if self.enable_events:
                self._events.extend(KVEvent("removed", h, namespace=n.key.namespace) for h in n.hashes)
            if self._is_candidate(parent):        # a dead branch cascades within this call
                self._push(parent)
        return np.concatenate(freed) if freed else EMPTY_SLOTS

    # ---- locks ----------------------------------------------------------------------------
    def inc_lock_ref(self, node: TreeNode) -> None:
        self._check_node(node)
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent
        self.root.lock_ref += 1

    def dec_lock_ref(self, node: TreeNode) -> None:
        self._check_node(node)
        # locks taken on this node itself: every lock below it also counts in its lock_ref
        own = node.lock_ref - sum(c.lock_ref for c in node.children.values()) - (node is self.root)
        if node is not self.root and own <= 0:
            raise ValueError(f"dec_lock_ref on unlocked node {node!r}"
                             + (" (only locks below it hold it)" if node.lock_ref else ""))
        if node is self.root and own <= 0:
            raise ValueError("dec_lock_ref on the root, which holds no lock")
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._push(node)
            node = node.parent
        self.root.lock_ref -= 1

    def _check_node(self, node) -> None:
        if not isinstance(node, TreeNode):
            raise TypeError(f"expected a TreeNode, got {type(node).__name__}")
        top = node
        while top.parent is not None:             # a live node of another tree has a parent too
            top = top.parent
        if top is not self.root:
            raise ValueError(f"{node!r} is not in this tree (evicted or foreign)")

    # ---- events ---------------------------------------------------------------------------
    def _emit_stored(self, n: TreeNode) -> None:
        ps, ns = self.page_size, n.key.namespace
        parent_hash = n.parent.hashes[-1] if n.parent.hashes else None
        n.hashes = []
        for i in range(len(n.key) // ps):
            page = n.key.buf[i * ps * _ITEM:(i + 1) * ps * _ITEM]
            h = chain_hash(parent_hash, ns, page, self.hash_algo)
            self._events.append(KVEvent("stored", h, parent_hash,
                                        tuple(memoryview(page).cast("I")), ns))
            n.hashes.append(h)
            parent_hash = h

    def take_events(self) -> list[KVEvent]:
        ev, self._events = self._events, []
        return ev

    # ---- inspection -----------------------------------------------------------------------
    def held_slots(self) -> Iterable[np.ndarray]:
        return [n.value for n in self._nodes() if n is not self.root]

    def pretty_print(self, max_tokens: int = 6) -> str:
        lines: list[str] = []

        def walk(n: TreeNode, depth: int) -> None:
            for c in sorted(n.children.values(), key=lambda c: c.key.tokens[:1]):
                toks = c.key.tokens
                head = ", ".join(map(str, toks[:max_tokens])) + (", ..." if len(toks) > max_tokens else "")
                ns = "" if c.key.namespace == (None, None) else f" ns={c.key.namespace}"
                lines.append(f"{'  ' * depth}[{head}] len={len(toks)} lock={c.lock_ref}{ns}")
                walk(c, depth + 1)
        walk(self.root, 0)
        lines.append(f"total={self.total_size()} evictable={self._evictable} "
                     f"protected={self._protected} nodes={self._num_nodes}")
        text = "\n".join(lines)
        print(text)
        return text

    def check_invariants(self) -> None:
        ps, ev, pr, count = self.page_size, 0, 0, 0
        live = {id(e[-1]) for e in self._heap if e[-2] == e[-1].hv}
        seen_slots: list[np.ndarray] = []
        assert self.root.lock_ref >= 1, f"root lock_ref {self.root.lock_ref} < 1"
        for n in self._nodes():
            count += 1
            for ck, c in n.children.items():
                assert c.parent is n, f"{c!r} has a wrong parent pointer"
                assert ck == self._child_key(n, c.key, 0), f"{c!r} stored under a wrong child-key"
                assert c.lock_ref <= n.lock_ref, f"lock_ref {c.lock_ref} of {c!r} > parent's {n.lock_ref}"
                if n is not self.root:
                    assert c.key.namespace == n.key.namespace, f"{c!r} mixes namespaces with its parent"
            if n is self.root:
                continue
            L = len(n.key)
            assert L > 0, f"{n!r} has an empty key"
            assert len(n.value) == L, f"{n!r} holds {len(n.value)} slots for {L} tokens"
            assert L % ps == 0, f"{n!r} key length {L} is not a multiple of page_size {ps}"
            assert n.lock_ref >= 0, f"{n!r} has negative lock_ref"
            if n.lock_ref:
                pr += L
            else:
                ev += L
            if self._is_candidate(n):
                assert id(n) in live, f"candidate {n!r} has no live heap entry"
            seen_slots.append(n.value)
        assert count == self._num_nodes, f"node count {self._num_nodes} != {count} reachable"
        assert ev == self._evictable, f"evictable_size {self._evictable} != {ev} counted"
        assert pr == self._protected, f"protected_size {self._protected} != {pr} counted"
        if seen_slots:
            allslots = np.concatenate(seen_slots)
            assert np.unique(allslots).size == allslots.size, "a slot is held by two tree nodes"


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
