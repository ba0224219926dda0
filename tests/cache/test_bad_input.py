"""Bad input raises a clear error naming the value and leaves the tree exactly as it was."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache.key import RadixKey
from radixkv.cache.radix import RadixCache

from tests.cache._helpers import FakeClock, tree_snapshot


@pytest.fixture
def tree():
    """[1,2,3] -> {[4,5] locked, [6,7] unlocked}; [9,9] unlocked; ns ("x", None) [1,2]."""
    t = RadixCache(clock=FakeClock(1), enable_events=True, evict_granularity="node")
    t.insert([1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    t.insert([1, 2, 3, 6, 7], [0, 1, 2, 5, 6])
    t.insert([9, 9], [7, 8])
    t.insert(RadixKey([1, 2], extra_key="x"), [9, 10])
    t.inc_lock_ref(t.match_prefix([1, 2, 3, 4, 5]).last_node)
    t.events().take()
    t.check_invariants()
    assert (t.total_size(), t.evictable_size(), t.protected_size(), t.num_nodes()) == (11, 6, 5, 6)
    return t


def _node(tree, tokens, **ns):
    m = tree.match_prefix(RadixKey(tokens, **ns), split=False)
    assert m.prefix_len == len(tokens)
    return m.last_node


def _unchanged(tree, fn, exc, match):
    before = tree_snapshot(tree)
    sizes = (tree.total_size(), tree.evictable_size(), tree.protected_size(), tree.num_nodes())
    with pytest.raises(exc, match=match):
        fn()
    assert (tree.total_size(), tree.evictable_size(), tree.protected_size(), tree.num_nodes()) == sizes
    assert tree_snapshot(tree) == before
    assert tree.events() is None or tree.events().take() == []
    tree.check_invariants()


@pytest.mark.parametrize("tokens, shown", [
    ([1, 2, -5], r"token id -5 is out of range"),
    ([1, 2.5, 3], r"token id 2\.5 is not an int"),
    ([1, "2", 3], r"token id '2' is not an int"),
    ([1, None], r"token id None is not an int"),
    ([1, 2**32], r"token id 4294967296 is out of range"),
    (np.array([1, -7]), r"token id -7 is out of range"),
    (np.array([1.0, 2.0]), r"1-D integer array, got dtype float64"),
])
def test_bad_tokens_in_insert_and_match(tree, tokens, shown):
    _unchanged(tree, lambda: tree.insert(tokens, np.arange(len(tokens)) + 50), ValueError, shown)
    _unchanged(tree, lambda: tree.match_prefix(tokens), ValueError, shown)
    _unchanged(tree, lambda: tree.match_prefix(tokens, split=False), ValueError, shown)


@pytest.mark.parametrize("slots, shown", [
    ([50, 51, 52], r"insert got 3 slots for 4 tokens"),
    ([50, 51, 52, 53, 54], r"insert got 5 slots for 4 tokens"),
    ([], r"insert got 0 slots for 4 tokens"),
    ([50, -1, 52, 53], r"slot -1 is negative"),
    ([50.0, 51.0, 52.0, 53.0], r"slots must be a 1-D sequence of ints, got dtype float64"),
    ([[50, 51, 52, 53]], r"slots must be a 1-D sequence of ints"),
])
def test_bad_slots(tree, slots, shown):
    # [1,2,8,8] diverges inside the locked edge [1,2,3]: a half-done insert would split it
    _unchanged(tree, lambda: tree.insert([1, 2, 8, 8], slots), ValueError, shown)


def test_slot_count_mismatch_simple(tree):
    _unchanged(tree, lambda: tree.insert([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4]), ValueError,
               r"insert got 5 slots for 6 tokens")
    _unchanged(tree, lambda: tree.insert([7], []), ValueError, r"insert got 0 slots for 1 tokens")


@pytest.mark.parametrize("prio", [1.5, "3", None, True])
def test_bad_priority(tree, prio):
    _unchanged(tree, lambda: tree.insert([1, 2, 3, 9], [0, 1, 2, 20], priority=prio), ValueError,
               rf"priority must be an int, got {prio!r}")


def test_unlock_unlocked_nodes(tree):
    _unchanged(tree, lambda: tree.dec_lock_ref(_node(tree, [9, 9])), ValueError,
               r"dec_lock_ref on unlocked node TreeNode\(id=\d+, len=2, lock=0\)")
    # [6,7]'s path is partly locked: its parent [1,2,3] is held by the [4,5] request
    leaf67 = _node(tree, [1, 2, 3, 6, 7])
    assert leaf67.parent.lock_ref == 1 and leaf67.lock_ref == 0
    _unchanged(tree, lambda: tree.dec_lock_ref(leaf67), ValueError, r"dec_lock_ref on unlocked node")
    _unchanged(tree, lambda: tree.dec_lock_ref(_node(tree, [1, 2], extra_key="x")), ValueError,
               r"dec_lock_ref on unlocked node")
    _unchanged(tree, lambda: tree.dec_lock_ref(tree.root), ValueError, r"dec_lock_ref on the root")
    # unlocking the held one twice: the second fails and changes nothing
    leaf45 = _node(tree, [1, 2, 3, 4, 5])
    tree.dec_lock_ref(leaf45)
    assert tree.protected_size() == 0 and tree.evictable_size() == 11
    _unchanged(tree, lambda: tree.dec_lock_ref(leaf45), ValueError, r"dec_lock_ref on unlocked node")


@pytest.mark.parametrize("n, shown", [(-1, r"got -1"), (1.5, r"got 1\.5"), ("3", r"got '3'"),
                                      (None, r"got None"), (True, r"got True"), (np.float64(2), r"got")])
def test_bad_evict_sizes(tree, n, shown):
    _unchanged(tree, lambda: tree.evict(n), ValueError, rf"evict needs a non-negative int, {shown}")


def test_evict_zero_and_numpy_int(tree):
    before = tree_snapshot(tree)
    assert tree.evict(0).size == 0
    assert tree_snapshot(tree) == before
    assert tree.evict(np.int64(1)).tolist() == [5, 6]          # lru: [6,7] (t=1, older id) first


def test_unknown_policy(tree):
    _unchanged(tree, lambda: RadixCache(eviction_policy="least-recent"), ValueError,
               r"unknown eviction policy 'least-recent'; valid: lru, mru, fifo, filo, lfu, slru, priority")
    _unchanged(tree, lambda: RadixCache(page_size=0), ValueError, r"page_size must be a positive int, got 0")


def test_node_from_another_tree(tree):
    other = RadixCache(clock=FakeClock())
    other.insert([1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    foreign = other.match_prefix([1, 2, 3, 4, 5]).last_node
    other_before = tree_snapshot(other)
    _unchanged(tree, lambda: tree.inc_lock_ref(foreign), ValueError, r"is not in this tree")
    _unchanged(tree, lambda: tree.dec_lock_ref(foreign), ValueError, r"is not in this tree")
    _unchanged(tree, lambda: tree.inc_lock_ref(other.root), ValueError, r"is not in this tree")
    assert tree_snapshot(other) == other_before
    other.check_invariants()


def test_regression_foreign_live_node_lock_leaves_both_trees_unchanged():
    # _check_node only rejected parentless nodes: a live node of another tree passed, the lock
    # walked up the other tree, moved this tree's size counters and crashed on None.
    a, b = RadixCache(clock=FakeClock()), RadixCache(clock=FakeClock())
    a.insert([1, 2, 3], [0, 1, 2])
    b.insert([1, 2], [5, 6])
    node = b.match_prefix([1, 2]).last_node
    snap_a, snap_b = tree_snapshot(a), tree_snapshot(b)
    with pytest.raises(ValueError, match="not in this tree"):
        a.inc_lock_ref(node)
    assert tree_snapshot(a) == snap_a and tree_snapshot(b) == snap_b
    b.inc_lock_ref(node)
    snap_b_locked = tree_snapshot(b)
    with pytest.raises(ValueError, match="not in this tree"):
        a.dec_lock_ref(node)
    assert tree_snapshot(a) == snap_a and tree_snapshot(b) == snap_b_locked
    assert (a.evictable_size(), a.protected_size()) == (3, 0)
    assert (b.evictable_size(), b.protected_size(), node.lock_ref) == (0, 2, 1)
    b.dec_lock_ref(node)
    assert tree_snapshot(b) != snap_b_locked and b.protected_size() == 0
    a.check_invariants()
    b.check_invariants()


def test_evicted_node(tree):
    leaf = _node(tree, [9, 9])
    assert tree.evict(1).tolist() == [5, 6]                    # lru, all at t=1: [6,7] is older
    assert tree.evict(1).tolist() == [7, 8]
    assert leaf.parent is None
    assert [e.kind for e in tree.events().take()] == ["removed"] * 4     # [6,7] and [9,9]
    _unchanged(tree, lambda: tree.inc_lock_ref(leaf), ValueError, r"is not in this tree \(evicted or foreign\)")
    _unchanged(tree, lambda: tree.dec_lock_ref(leaf), ValueError, r"is not in this tree")


def test_node_from_before_reset():
    t = RadixCache(clock=FakeClock())
    t.insert([1, 2, 3], [0, 1, 2])
    old = t.match_prefix([1, 2, 3]).last_node
    t.reset()
    t.insert([1, 2, 3], [3, 4, 5])
    _unchanged(t, lambda: t.inc_lock_ref(old), ValueError, r"is not in this tree")


@pytest.mark.parametrize("bad", [None, 3, "node", object()])
def test_non_node(tree, bad):
    _unchanged(tree, lambda: tree.inc_lock_ref(bad), TypeError, rf"expected a TreeNode, got {type(bad).__name__}")
    _unchanged(tree, lambda: tree.dec_lock_ref(bad), TypeError, r"expected a TreeNode")


def test_bad_key_objects(tree):
    _unchanged(tree, lambda: tree.insert(b"\x01\x00\x00\x00", [0]), TypeError, r"not bytes")
    _unchanged(tree, lambda: tree.match_prefix(5), TypeError, r"int")


def test_regression_unlock_node_locked_only_below(tree):
    # dec_lock_ref accepted a node whose lock_ref came only from locks on its descendants (and
    # the root whenever anything was locked), breaking lock_ref(parent) >= lock_ref(child) and
    # later driving lock counts negative. Such a node holds no lock of its own: it must raise.
    mid = _node(tree, [1, 2, 3])
    assert mid.lock_ref == 1 and tree.root.lock_ref == 2
    _unchanged(tree, lambda: tree.dec_lock_ref(mid), ValueError,
               r"dec_lock_ref on unlocked node .*only locks below it hold it")
    _unchanged(tree, lambda: tree.dec_lock_ref(tree.root), ValueError, r"dec_lock_ref on the root")
    # a direct lock on the interior node can be released, and only once
    tree.inc_lock_ref(mid)
    assert mid.lock_ref == 2 and tree.protected_size() == 5
    tree.dec_lock_ref(mid)
    assert mid.lock_ref == 1 and tree.protected_size() == 5
    _unchanged(tree, lambda: tree.dec_lock_ref(mid), ValueError, r"only locks below it hold it")
    # a direct lock on the root is released like any other
    tree.inc_lock_ref(tree.root)
    tree.dec_lock_ref(tree.root)
    assert tree.root.lock_ref == 2
    _unchanged(tree, lambda: tree.dec_lock_ref(tree.root), ValueError, r"on the root")
