"""Eviction orders: each policy's full victim order on one scripted history (injected clock).

History (one token per leaf, all leaves children of the root, so no cascades):
  t=1..4  insert a, b, c, d  with priorities a=0, b=5, c=1, d=2
  t=5..10 match  a, a, a, b, b, d
Resulting bookkeeping:   a: hits 3, last 7    b: hits 2, last 9
                         c: hits 0, last 3    d: hits 1, last 10
"""
from __future__ import annotations

import pytest

from radixkv.cache.policies import EVICTION_POLICIES, make_sort_key
from radixkv.cache.radix import RadixCache

from tests.cache._helpers import FakeClock

LEAVES = {"a": ([10, 11], 0), "b": ([20, 21], 5), "c": ([30, 31], 1), "d": ([40, 41], 2)}
SLOT_BASE = {"a": 100, "b": 200, "c": 300, "d": 400}

EXPECTED = {
    "lru": "cabd",                   # last access 3 < 7 < 9 < 10
    "mru": "dbac",
    "fifo": "abcd",                  # creation order
    "filo": "dcba",
    "lfu": "cdba",                   # hits 0 < 1 < 2 < 3
    "slru": "cdab",                  # probation (hits < 2): c, d by recency; then protected a, b
    "priority": "acdb",              # priorities 0 < 1 < 2 < 5
}


def _scripted(policy, **params):
    clock = FakeClock()
    tree = RadixCache(eviction_policy=policy, clock=clock, evict_granularity="node", **params)
    for t, (name, (tokens, prio)) in enumerate(LEAVES.items(), start=1):
        clock.t = t
        b = SLOT_BASE[name]
        assert tree.insert(tokens, [b, b + 1], priority=prio).prefix_len == 0
    for t, name in enumerate("aaabbd", start=5):
        clock.t = t
        assert tree.match_prefix(LEAVES[name][0]).prefix_len == 2
    return tree


def _victim_order(tree) -> str:
    by_slot = {b: name for name, b in SLOT_BASE.items()}
    order = ""
    for _ in range(len(LEAVES)):
        before = tree.total_size()
        freed = tree.evict(1).tolist()
        assert len(freed) == 2 and freed[1] == freed[0] + 1
        assert tree.total_size() == before - 2
        order += by_slot[freed[0]]
        tree.check_invariants()
    assert tree.evict(1).size == 0 and tree.total_size() == 0
    return order


def test_scripted_bookkeeping():
    tree = _scripted("lru")
    nodes = {n.key.tokens[0]: n for n in tree.root.children.values()}
    got = {name: (nodes[t[0]].hit_count, nodes[t[0]].last_access, nodes[t[0]].created, nodes[t[0]].priority)
           for name, (t, _) in LEAVES.items()}
    assert got == {"a": (3, 7, 1, 0), "b": (2, 9, 2, 5), "c": (0, 3, 3, 1), "d": (1, 10, 4, 2)}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_victim_order(policy):
    assert _victim_order(_scripted(policy)) == EXPECTED[policy]


def test_orders_are_all_distinct():
    assert len(set(EXPECTED.values())) == len(EXPECTED)
    assert set(EXPECTED) <= set(EVICTION_POLICIES.names())


def test_slru_custom_threshold():
    # threshold 3: only a (3 hits) is protected; probation c(3), b(9), d(10) by recency
    assert _victim_order(_scripted("slru", threshold=3)) == "cbda"
    # threshold 1: everything hit at least once is protected: c first, then a, b, d by recency
    assert _victim_order(_scripted("slru", threshold=1)) == "cabd"
    assert _victim_order(_scripted("slru", threshold=2)) == EXPECTED["slru"]


def test_lru_ties_break_by_creation():
    clock = FakeClock(1)
    tree = RadixCache(clock=clock, evict_granularity="node")
    for name in "abcd":
        tree.insert(LEAVES[name][0], [SLOT_BASE[name], SLOT_BASE[name] + 1])
    assert _victim_order(tree) == "abcd"


def test_policy_order_with_cascade_lru():
    # a leaf's evicted parent competes with the other leaves by its own access time
    clock = FakeClock(1)
    tree = RadixCache(clock=clock, evict_granularity="node")
    tree.insert([1, 2, 3], [0, 1, 2])
    tree.insert([1, 2, 4], [0, 1, 3])              # [1,2] -> {[3], [4]} all at t=1
    clock.t = 2
    tree.insert([9], [9])
    clock.t = 3
    tree.match_prefix([1, 2, 4])                   # [1,2] and [4] at t=3
    got = [tree.evict(1).tolist() for _ in range(5)]
    assert tree.total_size() == 0
    assert got[-1] == [] and got[:-1] == [[2], [9], [3], [0, 1]]


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown eviction policy 'lruu'; valid: lru, mru, fifo, filo, "
                                         r"lfu, slru, priority"):
        RadixCache(eviction_policy="lruu")
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_sort_key(["lru"])


def test_unknown_policy_option():
    with pytest.raises(ValueError, match=r"eviction policy 'lru' takes no option\(s\) \['threshold'\]"):
        RadixCache(eviction_policy="lru", threshold=3)
    with pytest.raises(ValueError, match=r"'slru' takes no option\(s\) \['thresh'\]"):
        RadixCache(eviction_policy="slru", thresh=3)
