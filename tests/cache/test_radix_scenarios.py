"""RadixCache scenarios with exact expected state: the worked example, eviction, splits,
locks, priorities, page sizes, namespaces, events and the request-level helpers."""
from __future__ import annotations

import itertools
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from radixkv.cache.base import CacheReq
from radixkv.cache.manager import CacheManager
from radixkv.cache.events import KVEvent, chain_hash
from radixkv.cache.key import RadixKey
from radixkv.cache.nocache import NoCache
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache

from tests.cache._helpers import FakeClock, all_nodes, depth_len, key, shape, toks, tree_snapshot

# ---- the worked example ------------------------------------------------------------------
S, F, Q1, Q2, RAG = toks(0, 512), toks(10_000, 1543), toks(20_000, 96), toks(30_000, 80), toks(40_000, 2112)
R1, R2, R3 = S + F + Q1, S + F + Q2, S + RAG


def _worked_example(page_size=1, granularity="page"):
    pool = SlotPool(8192, page_size)
    tree = RadixCache(page_size=page_size, clock=FakeClock(), evict_granularity=granularity)
    slots = {}
    for name, r in (("R1", R1), ("R2", R2), ("R3", R3)):
        s = pool.alloc(len(r))[:len(r)]
        slots[name] = s
        res = tree.insert(RadixKey(r), s)
        pool.free(s[:res.prefix_len])                       # duplicates back to the pool
        tree.check_invariants()
    return pool, tree, slots


def test_worked_example_split_on_match():
    tree = RadixCache(clock=FakeClock())
    s1 = np.arange(len(R1)) + 100
    res = tree.insert(RadixKey(R1), s1)
    assert res.prefix_len == 0 and list(tree.root.children.values()) == [res.last_node]
    assert shape(tree.root) == [(2151, [])]
    m = tree.match_prefix(RadixKey(R2), split=True)
    assert m.prefix_len == 2055
    assert m.slots.tolist() == s1[:2055].tolist()
    assert len(m.last_node.key) == 2055 and depth_len(m.last_node) == 2055
    assert shape(tree.root) == [(2055, [(96, [])])]
    assert list(m.last_node.children.values())[0].key.tokens == Q1
    assert tree.total_size() == 2151 and tree.num_nodes() == 3
    tree.check_invariants()


def test_worked_example_final_shape_and_size():
    pool, tree, slots = _worked_example()
    assert tree.total_size() == 4343 == 512 + 1543 + 96 + 80 + 2112
    assert len(R1) + len(R2) + len(R3) == 6910
    assert tree.evictable_size() == 4343 and tree.protected_size() == 0
    assert shape(tree.root) == [(512, [(1543, [(96, []), (80, [])]), (2112, [])])]
    (s_node,) = tree.root.children.values()
    assert s_node.key.tokens == S
    f_node, rag_node = sorted(s_node.children.values(), key=lambda c: c.key.tokens[0])
    assert f_node.key.tokens == F and rag_node.key.tokens == RAG
    q1_node, q2_node = sorted(f_node.children.values(), key=lambda c: c.key.tokens[0])
    assert q1_node.key.tokens == Q1 and q2_node.key.tokens == Q2
    # every stored token maps to the slot of the request that first stored it
    assert s_node.value.tolist() == slots["R1"][:512].tolist()
    assert f_node.value.tolist() == slots["R1"][512:2055].tolist()
    assert q2_node.value.tolist() == slots["R2"][2055:].tolist()
    assert rag_node.value.tolist() == slots["R3"][512:].tolist()
    assert tree.num_nodes() == 6
    pool.check_conservation(tree.held_slots())
    assert pool.used() == 4343


def _lock_paths(tree, times=3):
    locked = []
    for _ in range(times):
        for r in (R1, R2):
            m = tree.match_prefix(RadixKey(r))
            assert m.prefix_len == len(r)
            tree.inc_lock_ref(m.last_node)
            locked.append(m.last_node)
    return locked


def test_eviction_question_frees_exactly_the_dead_rag_leaf():
    pool, tree, slots = _worked_example(granularity="node")      # SGLang's: whole leaves
    _lock_paths(tree, times=3)
    (s_node,) = tree.root.children.values()
    assert s_node.lock_ref == 6 + 0 and tree.root.lock_ref == 7
    assert tree.protected_size() == 512 + 1543 + 96 + 80 == 2231
    assert tree.evictable_size() == 2112
    freed = tree.evict(300)
    assert freed.tolist() == slots["R3"][512:].tolist()
    assert tree.evictable_size() == 0 and tree.protected_size() == 2231 and tree.total_size() == 2231
    assert shape(tree.root) == [(512, [(1543, [(96, []), (80, [])])])]
    assert list(tree.root.children.values()) == [s_node] and s_node.key.tokens == S
    pool.free(freed)
    pool.check_conservation(tree.held_slots())
    snap = tree_snapshot(tree)
    assert tree.evict(10**9).size == 0
    assert tree_snapshot(tree) == snap
    tree.check_invariants()


def test_eviction_question_in_pages_frees_exactly_what_is_asked():
    """The default granularity, in Python as on the command line: evict(300) frees exactly
    300 tokens, the tail of the dead RAG leaf, and the leaf stays, shorter."""
    pool, tree, slots = _worked_example()
    assert tree.evict_granularity == "page"
    _lock_paths(tree, times=3)
    freed = tree.evict(300)
    assert freed.tolist() == slots["R3"][-300:].tolist()
    assert tree.evictable_size() == 2112 - 300 and tree.protected_size() == 2231
    pool.free(freed)
    pool.check_conservation(tree.held_slots())
    tree.check_invariants()


def test_eviction_interior_node_never_a_candidate_while_children_live():
    pool, tree, slots = _worked_example(granularity="node")
    # only the q1 path locked: q2 and RAG leaves are dead; S and F are interior
    m = tree.match_prefix(RadixKey(R1))
    tree.inc_lock_ref(m.last_node)
    freed = tree.evict(10**9)
    assert sorted(freed.tolist()) == sorted(slots["R2"][2055:].tolist() + slots["R3"][512:].tolist())
    assert shape(tree.root) == [(512, [(1543, [(96, [])])])]
    assert tree.total_size() == tree.protected_size() == 2151
    tree.dec_lock_ref(m.last_node)
    assert tree.evictable_size() == 2151 and tree.protected_size() == 0
    freed = tree.evict(1)          # q1 leaf, then the cascade stops: 96 >= 1
    assert freed.tolist() == slots["R1"][2055:].tolist()
    assert tree.evict(10**9).tolist() == slots["R1"][512:2055].tolist() + slots["R1"][:512].tolist()
    assert tree.total_size() == 0 and tree.num_nodes() == 1
    tree.check_invariants()


def test_cascade_parent_becomes_candidate_within_one_call():
    clock = FakeClock(1)
    tree = RadixCache(clock=clock)
    tree.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    tree.insert([1, 2, 3, 7], [10, 11, 12, 20])               # split: [1,2,3] -> {[4,5], [7]}
    clock.t = 2
    tree.insert([9], [30])
    assert shape(tree.root) == [(3, [(2, []), (1, [])]), (1, [])]
    # lru: [4,5] and [7] (t=1) go first, then their now-childless parent (t=1), before [9] (t=2)
    freed = tree.evict(6)
    assert freed.tolist() == [13, 14, 20, 10, 11, 12]
    assert shape(tree.root) == [(1, [])]
    assert tree.total_size() == tree.evictable_size() == 1
    tree.check_invariants()


def test_cascade_stops_at_locked_parent():
    tree = RadixCache(clock=FakeClock())
    tree.insert([1, 2, 3, 4], [0, 1, 2, 3])
    m = tree.match_prefix([1, 2, 9])                          # split at 2; last_node = [1,2]
    assert m.prefix_len == 2
    tree.inc_lock_ref(m.last_node)
    assert tree.evict(100).tolist() == [2, 3]
    assert shape(tree.root) == [(2, [])]
    assert tree.protected_size() == 2 and tree.evictable_size() == 0
    tree.check_invariants()


def test_regression_evict_cascade_after_heap_compaction():
    # evict() kept a local alias of the heap; when pushing a cascaded parent compacted (replaced)
    # the heap, later cascades went to the new heap and the call stopped early with evictable
    # tokens left. mru makes the many stale heap entries outlive the live one.
    for touches in range(1000, 1040):
        clock = itertools.count(1)
        tree = RadixCache(eviction_policy="mru", clock=lambda: float(next(clock)))
        tree.insert([1, 2], [0, 1])
        tree.insert([1, 2, 3, 4], [0, 1, 2, 3])
        tree.insert([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
        for _ in range(touches):
            tree.match_prefix([1, 2, 3, 4, 5, 6])
        freed = tree.evict(6)
        assert freed.tolist() == [4, 5, 2, 3, 0, 1], touches
        assert tree.total_size() == 0 and tree.num_nodes() == 1
        tree.check_invariants()


# ---- split bookkeeping -------------------------------------------------------------------
def test_split_keeps_suffix_access_time_and_lru_order():
    clock = FakeClock(1)
    tree = RadixCache(clock=clock, evict_granularity="node")
    tree.insert([1, 2, 3, 4], [10, 11, 12, 13])               # A at t=1
    clock.t = 3
    tree.insert([8, 9], [20, 21])                             # B at t=3
    clock.t = 5
    m = tree.match_prefix([1, 2, 7], split=True)
    assert m.prefix_len == 2 and m.slots.tolist() == [10, 11]
    parent = m.last_node
    (suffix,) = parent.children.values()
    assert parent.key.tokens == [1, 2] and suffix.key.tokens == [3, 4]
    assert parent.last_access == 5 and suffix.last_access == 1
    assert parent.created == 1 and suffix.created == 1
    assert parent.hit_count == 1 and suffix.hit_count == 0
    order = []
    for _ in range(3):
        order.append(tree.evict(1).tolist())
        tree.check_invariants()
    assert tree.total_size() == 0
    # the old suffix (t=1) before B (t=3); the parent (t=5) last
    assert order == [[12, 13], [20, 21], [10, 11]]


SPLIT_QUERIES = [
    [1, 2, 3, 4, 5, 6],          # exactly a full path
    [1, 2, 3, 4, 5, 6, 7, 8],    # beyond a leaf
    [1, 2, 3, 4, 9],             # diverges mid-edge of [4,5,6]
    [1, 2, 3, 4],                # ends mid-edge
    [1, 2, 7, 7],                # diverges mid-edge of [1,2,3]
    [1, 2, 3, 8, 8],             # full interior edge then sibling edge mid
    [5, 5],                      # no match at all
    [],
]


def _split_fixture(page_size=1):
    clock = FakeClock(1)
    tree = RadixCache(page_size=page_size, clock=clock)
    tree.insert([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
    clock.t = 2
    tree.insert([1, 2, 3, 8, 8, 8], [0, 1, 2, 6, 7, 8])
    clock.t = 3
    tree.match_prefix([1, 2, 3, 4, 5, 6])
    clock.t = 4
    return clock, tree


@pytest.mark.parametrize("q", SPLIT_QUERIES)
def test_match_split_false_mutates_nothing(q):
    clock, tree = _split_fixture()
    snap, calls = tree_snapshot(tree), clock.calls
    m = tree.match_prefix(q, split=False)
    assert tree_snapshot(tree) == snap
    assert clock.calls == calls
    assert depth_len(m.last_node) <= m.prefix_len
    _, tree2 = _split_fixture()
    m2 = tree2.match_prefix(q, split=True)
    assert (m.prefix_len, m.slots.tolist()) == (m2.prefix_len, m2.slots.tolist())
    assert depth_len(m2.last_node) == m2.prefix_len
    naive = max(_lcp(q, s) for s in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 8, 8, 8]))
    assert m.prefix_len == naive
    tree.check_invariants()
    tree2.check_invariants()


def test_match_split_false_partial_edge_last_node_is_parent():
    _, tree = _split_fixture()
    m = tree.match_prefix([1, 2, 3, 4, 9], split=False)
    assert m.prefix_len == 4 and m.slots.tolist() == [0, 1, 2, 3]
    assert m.last_node.key.tokens == [1, 2, 3]
    m = tree.match_prefix([1, 2, 7], split=False)
    assert m.prefix_len == 2 and m.last_node is tree.root


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ---- locks -------------------------------------------------------------------------------
def test_lock_unlock_move_sizes_exactly():
    tree = RadixCache(clock=FakeClock())
    tree.insert([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
    tree.insert([1, 2, 3, 9], [0, 1, 2, 6])
    assert shape(tree.root) == [(3, [(3, []), (1, [])])]
    leaf9 = tree.match_prefix([1, 2, 3, 9]).last_node
    leaf456 = tree.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    mid = leaf9.parent
    sizes = lambda: (tree.evictable_size(), tree.protected_size(), tree.total_size())  # noqa: E731
    assert sizes() == (7, 0, 7)
    tree.inc_lock_ref(leaf9)
    assert sizes() == (3, 4, 7) and (leaf9.lock_ref, mid.lock_ref, leaf456.lock_ref) == (1, 1, 0)
    tree.inc_lock_ref(leaf9)
    assert sizes() == (3, 4, 7) and (leaf9.lock_ref, mid.lock_ref) == (2, 2)
    tree.inc_lock_ref(leaf456)
    assert sizes() == (0, 7, 7) and mid.lock_ref == 3 and tree.root.lock_ref == 4
    tree.dec_lock_ref(leaf9)
    assert sizes() == (0, 7, 7) and (leaf9.lock_ref, mid.lock_ref) == (1, 2)
    tree.dec_lock_ref(leaf9)
    assert sizes() == (1, 6, 7) and (leaf9.lock_ref, mid.lock_ref) == (0, 1)
    assert tree.evict(10).tolist() == [6]                     # only [9] is free to go
    assert sizes() == (0, 6, 6)
    tree.dec_lock_ref(leaf456)
    assert sizes() == (6, 0, 6) and tree.root.lock_ref == 1
    tree.check_invariants()


def test_split_of_locked_edge_copies_lock_count():
    tree = RadixCache(clock=FakeClock())
    tree.insert(list(range(1, 9)), list(range(8)))
    leaf = tree.match_prefix(list(range(1, 9))).last_node
    tree.inc_lock_ref(leaf)
    tree.inc_lock_ref(leaf)
    assert tree.protected_size() == 8
    m = tree.match_prefix([1, 2, 3, 99])
    assert m.prefix_len == 3
    new_parent = m.last_node
    assert leaf.parent is new_parent and leaf.key.tokens == [4, 5, 6, 7, 8]
    assert new_parent.lock_ref == 2 and leaf.lock_ref == 2
    assert tree.protected_size() == 8 and tree.evictable_size() == 0
    tree.check_invariants()
    # insert through the locked split too
    tree.insert([1, 2, 3, 4, 5, 77], [0, 1, 2, 3, 4, 50])
    assert tree.protected_size() == 8 and tree.evictable_size() == 1
    (mid,) = [c for c in new_parent.children.values()]
    assert mid.key.tokens == [4, 5] and mid.lock_ref == 2
    tree.dec_lock_ref(leaf)
    tree.dec_lock_ref(leaf)
    assert tree.protected_size() == 0 and tree.evictable_size() == 9
    assert new_parent.lock_ref == mid.lock_ref == leaf.lock_ref == 0
    tree.check_invariants()


# ---- priority ----------------------------------------------------------------------------
def test_priority_is_max_over_inserts_through_node():
    tree = RadixCache(clock=FakeClock())
    tree.insert([1, 2, 3, 4], [0, 1, 2, 3], priority=1)
    tree.insert([1, 2, 5, 6], [0, 1, 4, 5], priority=5)
    node12 = tree.match_prefix([1, 2], split=False).last_node
    by = {tuple(c.key.tokens): c for c in node12.children.values()}
    assert node12.key.tokens == [1, 2]
    assert (node12.priority, by[(3, 4)].priority, by[(5, 6)].priority) == (5, 1, 5)
    tree.insert([1, 2], [0, 1], priority=3)
    assert (node12.priority, by[(3, 4)].priority, by[(5, 6)].priority) == (5, 1, 5)
    tree.insert([1, 2, 3, 4], [0, 1, 2, 3], priority=7)
    assert (node12.priority, by[(3, 4)].priority, by[(5, 6)].priority) == (7, 7, 5)
    # a split copies the priority to both halves
    tree.insert([1, 2, 3, 9], [0, 1, 2, 8], priority=0)
    n3 = by[(3, 4)].parent
    assert n3.key.tokens == [3] and n3.priority == 7 and by[(3, 4)].priority == 7
    assert [c.priority for c in n3.children.values() if c.key.tokens == [9]] == [0]
    tree.check_invariants()


# ---- page sizes --------------------------------------------------------------------------
@pytest.mark.parametrize("ps", [1, 2, 4, 16, 64])
def test_matches_are_page_aligned_and_exact(ps):
    rng = random.Random(ps)
    tree = RadixCache(page_size=ps, clock=FakeClock())
    pool = SlotPool(1 << 15, ps)
    stored = []
    for _ in range(40):
        base = rng.choice(stored) if stored and rng.random() < 0.8 else []
        k = base[:rng.randrange(0, len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(1, 3 * ps + 5))]
        s = pool.alloc(len(k))
        res = tree.insert(k, s[:len(k)])
        A = len(k) - len(k) % ps
        assert res.prefix_len == max([_lcp(k[:A], t) for t in stored] + [0]) // ps * ps
        pool.free(np.concatenate([s[:res.prefix_len], s[A:]]))
        stored.append(k[:A])
        tree.check_invariants()
        pool.check_conservation(tree.held_slots())
    assert tree.total_size() == len({tuple(t[:i]) for t in stored for i in range(ps, len(t) + 1, ps)}) * ps
    for _ in range(60):
        base = rng.choice(stored)
        q = base[:rng.randrange(0, len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 2 * ps))]
        expected = max(_lcp(q, t) for t in stored) // ps * ps
        m0 = tree.match_prefix(q, split=False)
        m1 = tree.match_prefix(q, split=True)
        assert m0.prefix_len == m1.prefix_len == expected
        assert m0.slots.tolist() == m1.slots.tolist() and len(m1.slots) == expected
        assert depth_len(m1.last_node) == expected
        tree.check_invariants()
    for n in all_nodes(tree)[1:]:
        assert len(n.key) % ps == 0


def test_shared_prefix_2055_matches_2048_at_page16():
    tree = RadixCache(page_size=16, clock=FakeClock())
    tree.insert(R1, np.arange(len(R1)))
    assert tree.total_size() == 2144                          # 2151 rounded down to pages
    m = tree.match_prefix(R2)
    assert m.prefix_len == 2048 and m.slots.tolist() == list(range(2048))
    assert shape(tree.root) == [(2048, [(96, [])])]
    res = tree.insert(R2, np.arange(len(R2)) + 5000)
    assert res.prefix_len == 2048
    assert shape(tree.root) == [(2048, [(96, []), (80, [])])]  # 2135 -> 2128 stored
    assert tree.total_size() == 2048 + 96 + 80
    tree.check_invariants()


def test_partial_trailing_page_not_stored():
    tree = RadixCache(page_size=16, clock=FakeClock())
    res = tree.insert(toks(0, 20), np.arange(20))
    assert res.prefix_len == 0 and len(res.last_node.key) == 16
    assert tree.total_size() == 16 and shape(tree.root) == [(16, [])]
    assert tree.insert(toks(0, 20), np.arange(20) + 100).prefix_len == 16
    assert tree.insert(toks(0, 15), np.arange(15)) == (0, tree.root)
    res = tree.insert(toks(0, 36), np.arange(36) + 200)
    assert res.prefix_len == 16 and tree.total_size() == 32
    assert shape(tree.root) == [(16, [(16, [])])]
    assert tree.match_prefix(toks(0, 40)).slots.tolist() == list(range(16)) + list(range(216, 232))
    assert tree.match_prefix(toks(0, 31)).prefix_len == 16
    tree.check_invariants()


# ---- namespaces --------------------------------------------------------------------------
NAMESPACES = [(None, None), ("lora-1", None), (None, "salt"), ("bc", "a"), ("c", "ab"), ("a", "bc")]


def test_namespaces_never_share_nodes_or_slots():
    tree = RadixCache(clock=FakeClock())
    tokens = [1, 2, 3, 4]
    for i, ns in enumerate(NAMESPACES):
        assert tree.match_prefix(key(tokens, ns)).prefix_len == 0
        assert tree.insert(key(tokens, ns), np.arange(4) + 10 * i).prefix_len == 0
    assert tree.total_size() == 4 * len(NAMESPACES) and tree.num_nodes() == 1 + len(NAMESPACES)
    assert len(tree.root.children) == len(NAMESPACES)
    for i, ns in enumerate(NAMESPACES):
        m = tree.match_prefix(key(tokens + [9], ns))
        assert m.prefix_len == 4 and m.slots.tolist() == (np.arange(4) + 10 * i).tolist()
        assert m.last_node.key.namespace == ns
    tree.check_invariants()
    # evicting one namespace leaves the others intact
    assert tree.insert(key(tokens + [5, 6], ("c", "ab")), np.array([40, 41, 42, 43, 44, 45])).prefix_len == 4
    assert tree.match_prefix(key(tokens + [5, 6], ("bc", "a"))).prefix_len == 4


def test_namespace_pairs_do_not_collide_in_event_hashes():
    tree = RadixCache(page_size=2, clock=FakeClock(), enable_events=True)
    tree.events().take()
    for i, ns in enumerate(NAMESPACES):
        tree.insert(key([1, 2, 3, 4], ns), np.arange(4) + 10 * i)
    ev = tree.events().take()
    assert [e.kind for e in ev] == ["stored"] * 2 * len(NAMESPACES)
    assert [e.namespace for e in ev] == [ns for ns in NAMESPACES for _ in range(2)]
    assert len({e.block_hash for e in ev}) == 2 * len(NAMESPACES)
    h = {e.namespace: e.block_hash for e in ev if e.parent_hash is None}
    assert h[("bc", "a")] != h[("c", "ab")] != h[("a", "bc")]


# ---- events ------------------------------------------------------------------------------
def _page(tokens):
    return np.array(tokens, dtype="=u4").tobytes()


def test_events_stored_chained_removed_cleared():
    ns = ("lora", None)
    tree = RadixCache(page_size=4, clock=FakeClock(), enable_events=True, evict_granularity="node")
    tree.events().take()
    k = list(range(100, 114))                                 # 14 tokens: 3 pages stored
    tree.insert(key(k, ns), np.arange(14))
    ev = tree.events().take()
    assert [e.kind for e in ev] == ["stored"] * 3
    assert ev[0].parent_hash is None
    assert ev[1].parent_hash == ev[0].block_hash and ev[2].parent_hash == ev[1].block_hash
    assert [e.token_ids for e in ev] == [tuple(k[0:4]), tuple(k[4:8]), tuple(k[8:12])]
    assert all(e.namespace == ns for e in ev)
    parent = None
    for i, e in enumerate(ev):
        assert e.block_hash == chain_hash(parent, ns, _page(k[4 * i:4 * i + 4]))
        parent = e.block_hash
    # a diverging insert: the split emits nothing, the new leaf chains on the shared page
    k2 = k[:4] + [7, 7, 7, 7, 8, 8, 8, 8]
    tree.insert(key(k2, ns), np.arange(12) + 50)
    ev2 = tree.events().take()
    assert [e.kind for e in ev2] == ["stored", "stored"]
    assert ev2[0].parent_hash == ev[0].block_hash and ev2[1].parent_hash == ev2[0].block_hash
    assert ev2[0].token_ids == (7, 7, 7, 7)
    assert tree.events().take() == []
    # evict the old suffix: its two pages are removed, one event each
    freed = tree.evict(1)
    assert freed.tolist() == list(range(4, 12))
    rem = tree.events().take()
    assert rem == [KVEvent("removed", ev[1].block_hash, namespace=ns),
                   KVEvent("removed", ev[2].block_hash, namespace=ns)]
    tree.evict(100)
    rem = tree.events().take()
    assert [e.kind for e in rem] == ["removed"] * 3
    assert [e.block_hash for e in rem] == [ev2[0].block_hash, ev2[1].block_hash, ev[0].block_hash]
    tree.reset()
    assert tree.events().take() == [KVEvent("cleared")]
    assert tree.total_size() == 0


def test_events_same_tokens_two_namespaces_hash_differently():
    tree = RadixCache(page_size=1, clock=FakeClock(), enable_events=True, hash_algo="xxhash")
    tree.events().take()
    tree.insert(key([5, 6]), [0, 1])
    tree.insert(key([5, 6], (None, "s")), [2, 3])
    ev = tree.events().take()
    assert len(ev) == 4
    assert {ev[0].block_hash, ev[1].block_hash}.isdisjoint({ev[2].block_hash, ev[3].block_hash})
    assert ev[0].token_ids == ev[2].token_ids == (5,)
    assert ev[0].block_hash == chain_hash(None, (None, None), _page([5]), "xxhash")


def test_events_off_by_default():
    tree = RadixCache(clock=FakeClock())
    tree.insert([1, 2], [0, 1])
    tree.evict(2)
    tree.reset()
    assert tree.events() is None                  # no events recorded, none to take


# ---- the request lifecycle (CacheManager) -------------------------------------------------
def test_request_helpers_page1():
    pool, tree = SlotPool(64), RadixCache(clock=FakeClock())
    mgr = CacheManager(tree, pool)
    r1 = CacheReq(RadixKey([1, 2, 3, 4, 5, 6]))
    assert mgr.admit(r1, r1.key[:-1], 6) == 0
    assert mgr.cache_req(r1, finished=False).size == 0
    assert r1.cached_len == 6 and r1.last_node.lock_ref == 1
    assert r1.slots.tolist() == [0, 1, 2, 3, 4, 5]
    assert tree.protected_size() == 6 and tree.evictable_size() == 0
    mgr.check()
    # r3 prefilled the same prompt independently (same batch, matched nothing): all 6 are
    # duplicates, freed by the manager
    r3 = CacheReq(RadixKey([1, 2, 3, 4, 5, 6]))
    assert mgr.admit(r3, r3.key[:0], 6) == 0
    assert r3.slots.tolist() == [6, 7, 8, 9, 10, 11]
    dup = mgr.cache_req(r3, finished=False)
    assert dup.tolist() == [6, 7, 8, 9, 10, 11]
    assert r3.slots.tolist() == [0, 1, 2, 3, 4, 5] and r3.cached_len == 6
    assert r3.last_node is r1.last_node and r1.last_node.lock_ref == 2
    mgr.check()
    # r2 shares 4 tokens via match; its own 2 come from the pool
    r2 = CacheReq(RadixKey([1, 2, 3, 4, 9, 9]))
    assert mgr.admit(r2, r2.key, 6) == 4
    own2 = r2.slots[4:]
    assert own2.tolist() == [6, 7]                 # freed duplicates are reused, in order
    assert r2.slots.tolist() == [0, 1, 2, 3] + own2.tolist() and r2.cached_len == 4
    mgr.check()
    # r1 decodes two tokens and finishes
    r1.key = r1.key + [7, 8]
    mgr.grow([r1], 2)
    own1 = r1.slots[6:]
    leaf6 = r1.last_node
    assert mgr.cache_req(r1, finished=True).size == 0
    assert (r1.last_node, r1.cached_len, r1.slots.size) == (None, 0, 0)
    assert leaf6.lock_ref == 1                               # r3 still holds it
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8], split=False).slots.tolist() == [0, 1, 2, 3, 4, 5] + own1.tolist()
    mgr.check()
    # r3 finishes with a different tail: [5,6] cached, its 2 new tokens stored
    r3.key = r3.key + [70]
    mgr.grow([r3], 1)
    assert mgr.cache_req(r3, finished=True).size == 0
    # r2 finishes: 4 cached, [9, 9] new
    assert mgr.cache_req(r2, finished=True).size == 0
    assert tree.protected_size() == 0 and tree.total_size() == 11
    mgr.check()
    assert mgr.holders() == []


def test_request_helpers_page4_tail_and_duplicates():
    pool, tree = SlotPool(128, 4), RadixCache(page_size=4, clock=FakeClock())
    mgr = CacheManager(tree, pool)
    k10 = list(range(1, 11))
    r = CacheReq(RadixKey(k10))
    assert mgr.admit(r, r.key[:-1], 10) == 0                 # 3 pages: 12 slots
    assert r.slots.tolist() == list(range(12))
    assert mgr.cache_req(r, finished=False).size == 0
    assert r.cached_len == 8 and r.slots.tolist() == list(range(12))   # keeps its tail page
    assert tree.total_size() == 8 and tree.protected_size() == 8
    mgr.check()
    r2 = CacheReq(RadixKey(k10))
    assert mgr.admit(r2, r2.key[:0], 10) == 0                # computed it all independently
    assert r2.slots.tolist() == list(range(12, 24))
    dup = mgr.cache_req(r2, finished=False)
    assert dup.tolist() == list(range(12, 20))
    assert r2.slots.tolist() == list(range(8)) + [20, 21, 22, 23] and r2.cached_len == 8
    node8 = r.last_node
    assert r2.last_node is node8 and node8.lock_ref == 2
    mgr.check()
    # r decodes 3 tokens (13 total): page 3 is complete and enters the tree
    r.key = r.key + [11, 12, 13]
    mgr.grow([r], 4)
    own = r.slots[12:]
    assert mgr.cache_req(r, finished=False).size == 0
    assert r.cached_len == 12 and r.last_node is not node8 and r.last_node.parent is node8
    assert r.last_node.value.tolist() == [8, 9, 10, 11]
    assert node8.lock_ref == 2 and r.last_node.lock_ref == 1           # r moved its lock down
    assert tree.protected_size() == 12 and tree.evictable_size() == 0
    mgr.check()
    # r2 finishes at 10 tokens: its tail page (partial) is freed, the lock released
    freed = mgr.cache_req(r2, finished=True)
    assert freed.tolist() == [20, 21, 22, 23]
    assert node8.lock_ref == 1
    mgr.check()
    # r finishes at 13: cached [0, 12), its tail page returned
    freed = mgr.cache_req(r, finished=True)
    assert freed.tolist() == own.tolist()
    assert tree.protected_size() == 0 and tree.evictable_size() == 12
    mgr.check()
    # a finished duplicate request: everything comes back (8 duplicates + the tail page)
    r3 = CacheReq(RadixKey(k10))
    assert mgr.admit(r3, r3.key[:0], 10) == 0
    r3_slots = r3.slots.tolist()
    freed = mgr.cache_req(r3, finished=True)
    assert freed.tolist() == r3_slots and len(r3_slots) == 12
    mgr.check()
    assert pool.used() == 12
    tree.check_invariants()


def test_request_helpers_short_request_locks_root():
    pool, tree = SlotPool(16, 4), RadixCache(page_size=4, clock=FakeClock())
    mgr = CacheManager(tree, pool)
    r = CacheReq(RadixKey([1, 2, 3]))
    assert mgr.admit(r, r.key[:-1], 3) == 0
    assert mgr.cache_req(r, finished=False).size == 0
    assert r.last_node is tree.root and r.cached_len == 0 and tree.root.lock_ref == 2
    assert tree.total_size() == 0
    freed = mgr.cache_req(r, finished=True)
    assert freed.tolist() == [0, 1, 2, 3] and tree.root.lock_ref == 1
    mgr.check()
    tree.check_invariants()


def test_nocache():
    pool, c = SlotPool(16), NoCache()
    mgr = CacheManager(c, pool)
    c.reset()
    r = CacheReq(RadixKey([1, 2, 3]))
    assert mgr.admit(r, r.key[:-1], 3) == 0
    assert c.match_prefix([1, 2, 3]) == (0, c.match_prefix([]).slots, None)
    assert c.match_prefix([1, 2, 3]).slots.size == 0
    assert mgr.cache_req(r, finished=False).size == 0 and r.slots.tolist() == [0, 1, 2]
    freed = mgr.cache_req(r, finished=True)
    assert freed.tolist() == [0, 1, 2] and r.slots.size == 0 and r.last_node is None
    mgr.check()
    assert c.insert([1, 2, 3], [5, 6, 7]).prefix_len == 3
    assert NoCache(page_size=2).insert([1, 2, 3], [5, 6, 7]).prefix_len == 2
    assert c.evict(10).size == 0
    assert (c.evictable_size(), c.protected_size(), c.total_size()) == (0, 0, 0)
    c.inc_lock_ref(None)
    c.dec_lock_ref(None)
    with pytest.raises(ValueError, match="NoCache holds no nodes"):
        c.inc_lock_ref(object())
    with pytest.raises(ValueError, match="2 slots for 3 tokens"):
        c.insert([1, 2, 3], [0, 1])
    with pytest.raises(ValueError, match="token id -1"):
        c.match_prefix([-1])


def test_demo_module_runs():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "radixkv.cache.radix"], cwd=root,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == [
        "insert [1, 2, 3]: 0 already cached, 3 stored",
        "insert [1, 2, 3]: 3 already cached, 0 stored",
        "insert [1, 2, 4, 5]: 2 already cached, 2 stored",
        "insert [1, 2, 4, 5, 6, 7]: 4 already cached, 2 stored",
        "insert [8, 9, 10, 11, 12]: 0 already cached, 5 stored",
    ]
    assert "[1, 2] len=2 lock=0" in lines and "  [3] len=1 lock=0" in lines
    assert "total=12 evictable=12 protected=0 nodes=6" in lines
    assert lines[-1] == "match [1, 2, 3, 13, 14]: prefix_len=3 matched=[1, 2, 3] slots=[0, 1, 2]"


@pytest.mark.parametrize("policy", ["filo", "mru"])
def test_regression_heap_tie_after_split_does_not_compare_nodes(policy):
    # a split hands the suffix's id to the new parent; heap versions were per node, so the
    # parent's entry could equal the suffix's stale one in key and version, and heapq then
    # compared two TreeNodes: TypeError inside evict()
    tree = RadixCache(eviction_policy=policy, clock=FakeClock(1))
    tree.insert([0, 0], [0, 1])
    assert tree.match_prefix([0]).prefix_len == 1
    assert tree.evict(1).tolist() == [1]
    assert tree.evict(1).tolist() == [0]
    assert tree.total_size() == 0 and tree.num_nodes() == 1
    tree.check_invariants()


def test_regression_no_cleared_event_at_construction():
    # building a cache used to report a "cleared" event before anything was stored
    for cache in (RadixCache(enable_events=True), BlockHashCache(block_size=4, enable_events=True)):
        assert cache.events().take() == []
        cache.reset()
        assert cache.events().take() == [KVEvent("cleared")]
