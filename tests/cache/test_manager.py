"""CacheManager scenarios with exact expected state: admission refused for memory changes
nothing (on the pure-read check not even hit counts or access times), a failed allocation
evicts nothing, calls that break the contract (a request whose handle holds no lock, a
request this manager did not admit, a second admission) raise before anything changes, the
`cached_prefix` memo is reused exactly while its answer cannot have changed, `release` with
and without inserting, whole-page growth, and `reset`.
"""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache.base import CacheReq
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.manager import CacheManager
from radixkv.cache.nocache import NoCache
from radixkv.cache.pool import OutOfSlotsError, SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.cache.radix.node import path_key

from tests.cache._helpers import FakeClock, all_nodes, edge_prefixes, key, shape, toks, tree_snapshot


# ---- helpers -----------------------------------------------------------------------------
def radix(num_slots: int, page_size: int = 1, granularity: str = "page"):
    clock = FakeClock()
    tree = RadixCache(page_size=page_size, clock=clock, evict_granularity=granularity)
    return CacheManager(tree, SlotPool(num_slots, page_size)), tree, clock


def served(mgr: CacheManager, tokens, ns=(None, None)) -> CacheReq:
    """One request matched, computed in full and finished: its whole pages enter the cache."""
    r = CacheReq(key(tokens, ns))
    assert mgr.admit(r, r.key, len(tokens)) is not None
    mgr.cache_req(r, finished=True)
    return r


def req_state(r: CacheReq) -> tuple:
    return r.slots.tolist(), r.cached_len, id(r.last_node), r.key


def content(tree: RadixCache) -> dict:
    """{(namespace, token prefix): slot of its last token}: what is cached, whatever the shape."""
    return {(ns, prefix): int(n.value[i]) for ns, prefix, n, i in edge_prefixes(tree, 1)}


def lock_refs(tree: RadixCache) -> dict:
    return {tuple(path_key(n).tokens): n.lock_ref for n in all_nodes(tree)}


def block_snapshot(c: BlockHashCache) -> tuple:
    return (sorted((bid, b.ref_cnt) for bid, b in c.blocks.items()), c.free_queue_ids(),
            c.duplicate_blocks, c.evictable_size(), c.protected_size())


def counting(cache):
    """Record every match_prefix call the manager makes (split flag), passing it through."""
    calls, orig = [], cache.match_prefix

    def match_prefix(k, split=True):
        calls.append(split)
        return orig(k, split)
    cache.match_prefix = match_prefix
    return calls


# ---- all or nothing: admission and allocation ------------------------------------------------
def _tight_radix():
    """16 slots: [1..8] cached and evictable (slots 0-7), a holder with 6 own slots (8-13),
    2 free: budget 10."""
    mgr, tree, clock = radix(16)
    served(mgr, toks(1, 8))
    h = CacheReq(key(toks(50, 6)))
    assert mgr.admit(h, h.key[:0], 6) == 0
    assert h.slots.tolist() == list(range(8, 14))
    assert (mgr.pool.available(), tree.evictable_size(), mgr.budget()) == (2, 8, 10)
    clock.t = 5.0
    return mgr, tree, h


def assert_refusal_untouched(mgr, tree, h, r, calls, before, r_before):
    """A refusal on `_tight_radix` decided on one pure read: tree (no split, hit counts, access
    times, heap), request, pool and holders as they were."""
    assert calls == [False]
    assert tree_snapshot(tree) == before
    assert req_state(r) == r_before
    assert mgr.pool.available() == 2 and mgr.evicted_tokens == 0
    assert mgr.holders() == [h]
    mgr.check()


@pytest.mark.parametrize("upto, reserve", [(16, 0), (8, 7)])
def test_admit_refused_on_pure_read_touches_nothing(upto, reserve):
    mgr, tree, h = _tight_radix()
    r = CacheReq(key([1, 2, 3, 4, 90, 91]))
    calls = counting(tree)
    before, r_before = tree_snapshot(tree), req_state(r)
    # 4 tokens hit: upto - 4 + reserve = 12 or 11 > budget 10, decided without splitting
    assert mgr.admit(r, r.key[:5], upto, reserve) is None
    assert_refusal_untouched(mgr, tree, h, r, calls, before, r_before)


@pytest.mark.parametrize("upto, reserve", [(14, 0), (10, 1)])
def test_regression_refusal_that_only_locking_decides_touches_nothing(upto, reserve):
    # the pure read says upto - 4 + reserve = 10 or 7 fits in 10, but locking the hit takes its
    # 4 evictable tokens out of the budget (6). The refusal used to be decided after the
    # splitting match: an edge split, a hit counted and an access refreshed for a request not
    # served, every round it stayed refused. lock_cost decides it on the pure read now.
    mgr, tree, h = _tight_radix()
    r = CacheReq(key([1, 2, 3, 4, 90, 91]))
    before, r_before = tree_snapshot(tree), req_state(r)
    calls = counting(tree)
    peek = tree.match_prefix(r.key[:5], split=False)
    assert tree.admission().lock_cost(r.key[:5], peek.last_node, peek.prefix_len) == 4
    calls.clear()
    assert mgr.admit(r, r.key[:5], upto, reserve) is None
    assert_refusal_untouched(mgr, tree, h, r, calls, before, r_before)


def test_admit_evicts_exactly_what_is_short():
    mgr, tree, h = _tight_radix()
    r = CacheReq(key([1, 2, 3, 4, 90, 91]))
    assert mgr.admit(r, r.key[:5], 10) == 4                # need 6 of budget 6 after the lock
    assert r.slots[:4].tolist() == [0, 1, 2, 3] and r.cached_len == 4
    assert sorted(r.slots[4:].tolist()) == [4, 5, 6, 7, 14, 15]
    assert mgr.evicted_tokens == 4                        # the unlocked leaf [5..8], nothing more
    assert shape(tree.root) == [(4, [])]
    assert path_key(r.last_node).tokens == [1, 2, 3, 4] and r.last_node.lock_ref == 1
    assert (mgr.pool.available(), tree.evictable_size(), tree.protected_size()) == (0, 0, 4)
    mgr.check()


def test_alloc_evicts_only_what_is_short_in_eviction_order():
    mgr, tree, clock = radix(8, granularity="node")
    for t, seq in enumerate(([1, 2], [3, 4], [5, 6])):
        clock.t = float(t)
        served(mgr, seq)                                  # slots 0-1, 2-3, 4-5
    got = mgr.alloc(3)                                    # 2 free, 1 short: one LRU leaf goes
    assert sorted(got.tolist()) == [0, 1, 6]
    assert mgr.evicted_tokens == 2 and tree.total_size() == 4
    assert sorted(content(tree).values()) == [2, 3, 4, 5]
    got2 = mgr.alloc(1)                                   # a free slot: no eviction
    assert got2.tolist() == [7] and mgr.evicted_tokens == 2
    mgr.pool.free(np.concatenate([got, got2]))
    mgr.check()


def test_blockhash_admit_evicts_whole_blocks_from_the_queue_head():
    c, pool = BlockHashCache(block_size=2), SlotPool(8, 2)
    mgr = CacheManager(c, pool)
    served(mgr, [1, 2, 3, 4])                              # blocks 0, 1
    served(mgr, [5, 6])                                   # block 2
    assert c.free_queue_ids() == [1, 0, 2] and pool.available() == 2
    r = CacheReq(key([7, 7, 7]))
    assert mgr.admit(r, r.key, 3) == 0                    # 4 slots: 2 free, block 1 evicted
    assert sorted(r.slots.tolist()) == [2, 3, 6, 7]
    assert mgr.evicted_tokens == 2 and c.free_queue_ids() == [0, 2]
    mgr.check()


def test_blockhash_admit_refused_on_pure_read_touches_nothing():
    c, pool = BlockHashCache(block_size=4), SlotPool(16, 4)
    mgr = CacheManager(c, pool)
    served(mgr, toks(1, 8))                               # blocks 0, 1
    h = CacheReq(key(toks(50, 6)))
    assert mgr.admit(h, h.key[:0], 6) == 0                # pages 2, 3
    assert (pool.available(), mgr.budget()) == (0, 8)
    r = CacheReq(key([1, 2, 3, 4, 90, 91]))
    before, r_before = block_snapshot(c), req_state(r)
    assert c.free_queue_ids() == [1, 0]
    assert mgr.admit(r, r.key[:5], 16) is None            # 16 - 4 > 8
    assert block_snapshot(c) == before and req_state(r) == r_before
    assert mgr.admit(r, r.key[:5], 12) is None            # 12 - 4 = 8 fits until block 0 is locked
    assert (c.evictable_size(), c.protected_size(), pool.available()) == (8, 0, 0)
    assert req_state(r) == r_before and mgr.evicted_tokens == 0
    assert mgr.holders() == [h]
    mgr.check()


@pytest.mark.parametrize("upto, reserve, shown", [(20, -15, "reserve needs a non-negative int, got -15"),
                                                  (9.5, 0, "upto needs a non-negative int, got 9.5"),
                                                  (True, 0, "got True"), (-3, 0, "got -3")])
def test_regression_admit_bad_sizes_raise_before_locking(upto, reserve, shown):
    # admit used to split and lock the hit, then fail in the allocation: a lock nobody held
    mgr, tree, h = _tight_radix()
    r = CacheReq(key([1, 2, 3, 4, 90, 91]))
    before, r_before = tree_snapshot(tree), req_state(r)
    with pytest.raises(ValueError, match=shown):
        mgr.admit(r, r.key[:5], upto, reserve)
    assert tree_snapshot(tree) == before
    assert req_state(r) == r_before and mgr.pool.available() == 2
    assert tree.protected_size() == 0


def test_alloc_out_of_slots_evicts_nothing():
    mgr, tree, h = _tight_radix()
    before = tree_snapshot(tree)
    with pytest.raises(OutOfSlotsError, match="asked for 11 slots; only 2 free and 8 evictable"):
        mgr.alloc(11)
    assert tree_snapshot(tree) == before
    assert mgr.pool.available() == 2 and mgr.evicted_tokens == 0
    got = mgr.alloc(10)                                   # exactly the budget: evicts all 8
    assert sorted(got.tolist()) == list(range(8)) + [14, 15]
    assert mgr.evicted_tokens == 8 and tree.total_size() == 0
    mgr.pool.free(got)
    mgr.check()


def test_grow_refused_changes_nothing():
    mgr, tree, h = _tight_radix()
    stranger = CacheReq(key([7, 7]))
    before, h_before = tree_snapshot(tree), req_state(h)
    with pytest.raises(ValueError, match="holds no slots from this manager"):
        mgr.grow([stranger], 1)
    with pytest.raises(ValueError, match="holds no slots from this manager"):
        mgr.grow([h, stranger], 1)                        # checked before h gets anything
    with pytest.raises(OutOfSlotsError):
        mgr.grow([h], 11)
    with pytest.raises(OutOfSlotsError):
        mgr.grow([h, h], 6)                               # 12 in one allocation
    assert tree_snapshot(tree) == before and req_state(h) == h_before
    assert req_state(stranger) == (stranger.slots.tolist(), 0, id(None), stranger.key)
    assert mgr.pool.available() == 2 and mgr.evicted_tokens == 0
    mgr.check()


def test_grow_gives_whole_pages():
    mgr, tree, _ = radix(32, 4)
    r1, r2 = CacheReq(key([1, 2, 3])), CacheReq(key([4, 5, 6]))
    assert mgr.admit(r1, r1.key[:0], 3) == 0 and mgr.admit(r2, r2.key[:0], 3) == 0
    mgr.grow([r1, r2], 2)                                 # each gets its own page
    assert len(r1.slots) == len(r2.slots) == 8
    assert {int(s) // 4 for s in r1.slots[4:]} & {int(s) // 4 for s in r2.slots[4:]} == set()
    mgr.check()
    assert mgr.pool.used() == 16
    assert mgr.cache_req(r1, finished=True).size == 8
    assert mgr.cache_req(r2, finished=True).size == 8
    assert mgr.pool.available() == 32
    mgr.check()


# ---- contract breaks: everything is checked before anything changes -------------------------------
def _running_radix():
    """[1..6] and [1,2,3,7,8] cached, unlocked; r hit [1,2,3,4] (a split at 4) and computed 6."""
    mgr, tree, clock = radix(32)
    served(mgr, toks(1, 6))
    clock.t = 1.0
    served(mgr, [1, 2, 3, 7, 8])
    clock.t = 2.0
    r = CacheReq(key([1, 2, 3, 4, 9]))
    assert mgr.admit(r, r.key, 8) == 4
    r.key = key([1, 2, 3, 4, 9, 10])
    return mgr, tree, r


def _node(tree, tokens):
    return next(n for n in all_nodes(tree) if path_key(n).tokens == tokens)


def _other_tree_node():
    other = RadixCache()
    other.insert([1, 2, 3], [0, 1, 2])
    return _node(other, [1, 2, 3])


def _evicted_node(mgr, tree):
    n = _node(tree, [1, 2, 3, 7, 8])
    assert n.lock_ref == 0
    mgr.pool.free(tree.evict(tree.evictable_size()))
    assert n.parent is None
    return n


TAMPER = {
    "unlocked node": (lambda mgr, tree: _node(tree, [1, 2, 3, 7, 8]), ValueError, "unlocked node"),
    "held only from below": (lambda mgr, tree: _node(tree, [1, 2, 3]), ValueError, "only locks below it"),
    "root": (lambda mgr, tree: tree.root, ValueError, "on the root"),
    "other tree": (lambda mgr, tree: _other_tree_node(), ValueError, "not in this tree"),
    "evicted node": (_evicted_node, ValueError, "not in this tree"),
    "not a node": (lambda mgr, tree: "node", TypeError, "expected a TreeNode"),
}
CALLS = {
    "cache_req unfinished": lambda mgr, r: mgr.cache_req(r, finished=False),
    "cache_req finished": lambda mgr, r: mgr.cache_req(r, finished=True),
    "release insert": lambda mgr, r: mgr.release(r, insert=True),
    "release": lambda mgr, r: mgr.release(r, insert=False),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("tamper", list(TAMPER))
def test_regression_unlocked_handle_raises_before_inserting(tamper, call):
    # the cache's request helpers used to insert first and raise after: a node gained a lock
    # that was never released, and the request and the tree held the same slots
    mgr, tree, r = _running_radix()
    make, exc, msg = TAMPER[tamper]
    own = r.last_node
    r.last_node = make(mgr, tree)
    before, r_before, avail = tree_snapshot(tree), req_state(r), mgr.pool.available()
    with pytest.raises(exc, match=msg):
        CALLS[call](mgr, r)
    assert tree_snapshot(tree) == before
    assert req_state(r) == r_before and mgr.pool.available() == avail
    assert mgr.holders() == [r]
    r.last_node = own                                     # untampered, it finishes cleanly
    mgr.check()
    CALLS[call](mgr, r)
    mgr.check()


@pytest.mark.parametrize("call", list(CALLS))
def test_blockhash_unlocked_handle_raises_before_inserting(call):
    c, pool = BlockHashCache(block_size=2), SlotPool(32, 2)
    mgr = CacheManager(c, pool)
    served(mgr, [1, 2, 3, 4])                              # blocks 0, 1
    served(mgr, [7, 8])                                   # block 2
    r = CacheReq(key([1, 2, 5, 6]))
    assert mgr.admit(r, r.key, 6) == 2
    assert r.slots.tolist() == [0, 1, 6, 7, 8, 9] and c.free_queue_ids() == [1, 2]
    r.key = key([1, 2, 5, 6, 9])
    own = r.last_node
    other = BlockHashCache(block_size=2)
    other.insert([1, 2], [0, 1])

    def evicted():
        chain = c.match_prefix(key([7, 8]), split=False).last_node
        pool.free(c.evict(4))                             # blocks 1 and 2, the queue's head
        assert sorted(c.blocks) == [0]
        return chain

    cases = [
        (lambda: c.match_prefix(key([7, 8]), split=False).last_node, "dec_lock_ref on unreferenced"),
        (lambda: tuple(own) * 2, "dec_lock_ref on unreferenced"),   # r's one reference, twice
        (lambda: other.match_prefix(key([1, 2]), split=False).last_node, "no longer cached"),
        (evicted, "no longer cached"),
    ]
    for make, msg in cases:
        r.last_node = make()
        before, r_before, avail = block_snapshot(c), req_state(r), pool.available()
        with pytest.raises(ValueError, match=msg):
            CALLS[call](mgr, r)
        assert block_snapshot(c) == before and req_state(r) == r_before
        assert pool.available() == avail and mgr.holders() == [r]
    r.last_node = own
    mgr.check()
    CALLS[call](mgr, r)
    mgr.check()


def test_nocache_foreign_handle_raises_before_changing():
    pool = SlotPool(16)
    mgr = CacheManager(NoCache(), pool)
    r = CacheReq(key([1, 2, 3]))
    assert mgr.admit(r, r.key, 3) == 0
    r.last_node = object()
    r_before = req_state(r)
    for call in CALLS.values():
        with pytest.raises(ValueError, match="NoCache holds no nodes"):
            call(mgr, r)
        assert req_state(r) == r_before and pool.available() == 13
    r.last_node = None
    mgr.release(r)
    assert pool.available() == 16


def test_request_not_admitted_here_raises_and_changes_nothing():
    mgr, tree, r = _running_radix()
    other_mgr = CacheManager(RadixCache(), SlotPool(8))
    elsewhere = CacheReq(key([1, 2, 3]))
    assert other_mgr.admit(elsewhere, elsewhere.key, 3) == 0
    never = CacheReq(key([1, 2, 3]))
    before, avail = tree_snapshot(tree), mgr.pool.available()
    for stranger in (never, elsewhere):
        s_before = req_state(stranger)
        for call in [*CALLS.values(), lambda m, q: m.grow([q], 1)]:
            with pytest.raises(ValueError, match="holds no slots from this manager"):
                call(mgr, stranger)
            assert req_state(stranger) == s_before
    assert tree_snapshot(tree) == before and mgr.pool.available() == avail
    mgr.cache_req(r, finished=True)
    after = tree_snapshot(tree)
    with pytest.raises(ValueError, match="holds no slots from this manager"):
        mgr.cache_req(r, finished=True)                   # finished once: no longer a holder
    assert tree_snapshot(tree) == after
    mgr.check()


def test_second_admit_raises_and_changes_nothing():
    mgr, tree, r = _running_radix()
    calls = counting(tree)
    before, r_before, avail = tree_snapshot(tree), req_state(r), mgr.pool.available()
    with pytest.raises(ValueError, match="already holds slots: admit it once"):
        mgr.admit(r, r.key, 8)
    assert calls == []
    assert tree_snapshot(tree) == before and req_state(r) == r_before
    assert mgr.pool.available() == avail and mgr.holders() == [r]
    mgr.check()


@pytest.mark.parametrize("computed, msg", [(3, "3 computed tokens but 8 slots and 4 cached"),
                                           (9, "9 computed tokens but 8 slots and 4 cached")])
def test_key_outside_its_slots_raises_before_inserting(computed, msg):
    mgr, tree, r = _running_radix()
    r.key = key([1, 2, 3, 4, 9, 10, 11, 12, 13][:computed])
    before, r_before = tree_snapshot(tree), req_state(r)
    for name, call in CALLS.items():
        if name == "release":
            continue                      # inserts nothing, so reads no key: see below
        with pytest.raises(ValueError, match=msg):
            call(mgr, r)
        assert tree_snapshot(tree) == before and req_state(r) == r_before
    mgr.check()
    # release without insert still works: a request whose key no longer covers what it holds
    # could otherwise never give its lock and slots back
    mgr.release(r)
    assert mgr.holders() == [] and tree.protected_size() == 0
    mgr.check()


# ---- the cached_prefix memo -------------------------------------------------------------------
def _asker(mgr, cache):
    """ask(owner, key, hit, reused): cached_prefix's answer equals a fresh pure read, and the
    manager matched again exactly when not reused."""
    calls, fresh = counting(cache), type(cache).match_prefix.__get__(cache)

    def ask(owner, k, hit, reused):
        n = len(calls)
        p, node = mgr.cached_prefix(owner, k)
        assert calls[n:] == ([] if reused else [False])
        m = fresh(k, split=False)
        assert p == m.prefix_len == hit
        if isinstance(cache, BlockHashCache):
            assert [id(b) for b in node] == [id(b) for b in m.last_node]
        else:
            assert node is m.last_node
        return node
    return ask


def test_memo_radix_reused_until_the_answer_can_change():
    mgr, tree, clock = radix(64)
    served(mgr, toks(1, 4))
    served(mgr, toks(1, 8))                               # [1..4] -> [5..8]
    ask = _asker(mgr, tree)
    o, o2 = object(), object()
    k = key([1, 2, 3, 4, 5, 6, 9, 9])
    assert ask(o, k, 6, reused=False) is _node(tree, [1, 2, 3, 4])   # a partial edge ends above it
    ask(o, k, 6, reused=True)
    ask(o2, key([1, 2, 3, 4, 5, 6, 7]), 7, reused=False)  # owners have their own answers
    ask(o, k, 6, reused=True)
    served(mgr, [20, 21])                                 # elsewhere: only the root's children
    ask(o, k, 6, reused=True)
    r = CacheReq(key(toks(1, 8)))
    assert mgr.admit(r, r.key, 8) == 8                    # locks move no answer
    ask(o, k, 6, reused=True)
    mgr.release(r)
    ask(o, k, 6, reused=True)
    served(mgr, toks(1, 8) + [30])                        # below the edge it read, not into it
    ask(o, k, 6, reused=True)
    clock.t = 1.0
    served(mgr, [1, 2, 3, 4, 5, 6, 9])                    # splits the edge it read
    leaf = ask(o, k, 7, reused=False)
    assert path_key(leaf).tokens == [1, 2, 3, 4, 5, 6, 9]
    ask(o, k, 7, reused=True)
    mgr.forget(o)
    ask(o, k, 7, reused=False)
    k = k + [9]                                           # the owner's key grew
    ask(o, k, 7, reused=False)
    ask(o, k, 7, reused=True)
    mgr.pool.free(tree.evict(tree.evictable_size()))
    assert leaf.parent is None                            # its node was evicted
    ask(o, k, 0, reused=False)
    ask(o, k, 0, reused=True)
    served(mgr, [1, 2, 3, 4, 5, 6])
    ask(o, k, 6, reused=False)
    tree.reset()                                          # the cache alone: the memo is stale
    mgr.pool.reset()
    ask(o, k, 0, reused=False)
    served(mgr, [1, 2, 3, 4, 5, 6])
    ask(o, k, 6, reused=False)
    mgr.reset()
    ask(o, k, 0, reused=False)


def test_memo_blockhash_reused_until_a_block_is_registered_or_dropped():
    c, pool = BlockHashCache(block_size=4), SlotPool(64, 4)
    mgr = CacheManager(c, pool)
    served(mgr, toks(1, 8))
    ask = _asker(mgr, c)
    o, k = object(), key(toks(1, 8) + [9, 9, 9, 9])
    ask(o, k, 8, reused=False)
    ask(o, k, 8, reused=True)
    r = CacheReq(key(toks(1, 8)))
    assert mgr.admit(r, r.key, 8) == 8                    # ref counts and queue order move no answer
    ask(o, k, 8, reused=True)
    mgr.release(r)
    ask(o, k, 8, reused=True)
    served(mgr, toks(1, 8) + [9, 9, 9, 9])
    ask(o, k, 12, reused=False)
    served(mgr, toks(50, 4))                              # any registration restamps the cache
    ask(o, k, 12, reused=False)
    assert c.free_queue_ids() == [2, 1, 0, 3]
    pool.free(c.evict(4))                                 # any drop too: here the [9, 9, 9, 9] block
    ask(o, k, 8, reused=False)
    c.reset()
    pool.reset()
    ask(o, k, 0, reused=False)
    ask(o, k, 0, reused=True)


def test_memo_not_used_by_a_cache_without_stamps():
    mgr = CacheManager(NoCache(), SlotPool(8))
    ask = _asker(mgr, mgr.cache)
    o = object()
    ask(o, key([1, 2]), 0, reused=False)
    ask(o, key([1, 2]), 0, reused=False)


def test_refused_admission_keeps_its_memo_and_admission_forgets_it():
    mgr, tree, h = _tight_radix()
    ask = _asker(mgr, tree)
    r = CacheReq(key(toks(1, 8) + [90]))
    assert mgr.admit(r, r.key, 20) is None                # 20 - 8 > 10: a memoised pure read
    ask(r, r.key, 8, reused=True)
    mgr.release(h)
    assert mgr.admit(r, r.key, 16) == 8                   # no split, no eviction: the memo's
    mgr.release(r)                                        # node is untouched, yet it is gone
    assert shape(tree.root) == [(8, [])] and mgr.evicted_tokens == 0
    ask(r, r.key, 8, reused=False)
    ask(r, r.key, 8, reused=True)


# ---- release ------------------------------------------------------------------------------------
def _retracting_radix():
    """[1..6] cached (slots 0-5); r hit [1,2,3] (a split at 3), 10 slots, computed 8."""
    mgr, tree, clock = radix(32)
    served(mgr, toks(1, 6))
    before = content(tree)
    clock.t = 1.0
    r = CacheReq(key([1, 2, 3, 10, 11, 12, 13, 14]))
    assert mgr.admit(r, r.key[:4], 10) == 3
    assert r.slots.tolist() == [0, 1, 2] + list(range(6, 13))
    return mgr, tree, r, before


def test_release_insert_caches_its_kv_and_returns_the_rest():
    mgr, tree, r, _ = _retracting_radix()
    mgr.release(r, insert=True)
    assert (r.slots.size, r.cached_len, r.last_node) == (0, 0, None) and mgr.holders() == []
    assert content(tree)[((None, None), (1, 2, 3, 10, 11, 12, 13, 14))] == 10
    assert (tree.total_size(), tree.evictable_size(), tree.protected_size()) == (11, 11, 0)
    assert set(lock_refs(tree).values()) == {0, 1} and tree.root.lock_ref == 1   # the root's own
    assert mgr.pool.available() == 32 - 11                # slots 11, 12 came back
    mgr.check()
    again = CacheReq(key([1, 2, 3, 10, 11, 12, 13, 14]))
    assert mgr.admit(again, again.key, 8) == 8
    assert again.slots.tolist() == [0, 1, 2, 6, 7, 8, 9, 10]
    mgr.check()


def test_release_without_insert_leaves_only_the_split():
    mgr, tree, r, before = _retracting_radix()
    mgr.release(r, insert=False)
    assert (r.slots.size, r.cached_len, r.last_node) == (0, 0, None) and mgr.holders() == []
    assert content(tree) == before
    assert shape(tree.root) == [(3, [(3, [])])]
    assert (tree.total_size(), tree.evictable_size(), tree.protected_size()) == (6, 6, 0)
    assert set(lock_refs(tree).values()) == {0, 1} and tree.root.lock_ref == 1   # the root's own
    assert mgr.pool.available() == 26
    mgr.check()


def test_release_insert_after_another_stored_the_same_frees_duplicates():
    mgr, tree, r, _ = _retracting_radix()
    twin = CacheReq(key([1, 2, 3, 10, 11, 12, 13, 14]))
    assert mgr.admit(twin, twin.key[:3], 8) == 3
    assert twin.slots.tolist() == [0, 1, 2] + list(range(13, 18))
    mgr.cache_req(twin, finished=True)                    # stores [10..14] in slots 13-17
    stored = content(tree)
    mgr.release(r, insert=True)                           # all 7 own slots come back
    assert content(tree) == stored
    assert stored[((None, None), (1, 2, 3, 10, 11, 12, 13, 14))] == 17
    assert mgr.pool.available() == 32 - 11 and tree.protected_size() == 0
    mgr.check()


def test_blockhash_release_insert_registers_its_blocks():
    c, pool = BlockHashCache(block_size=2), SlotPool(16, 2)
    mgr = CacheManager(c, pool)
    served(mgr, [1, 2, 3, 4])                              # blocks 0, 1
    r = CacheReq(key([1, 2, 5, 6, 7]))
    assert mgr.admit(r, r.key[:4], 6) == 2                 # block 0 locked, pages 2, 3 own
    assert r.slots.tolist() == [0, 1, 4, 5, 6, 7]
    mgr.release(r, insert=True)                           # [5, 6] -> block 2; page 3 back
    assert sorted((bid, b.ref_cnt) for bid, b in c.blocks.items()) == [(0, 0), (1, 0), (2, 0)]
    assert pool.available() == 10 and c.evictable_size() == 6
    again = CacheReq(key([1, 2, 5, 6, 7]))
    assert mgr.admit(again, again.key, 5) == 4
    assert again.slots[:4].tolist() == [0, 1, 4, 5]
    mgr.release(again)
    r2 = CacheReq(key([1, 2, 8, 8]))
    assert mgr.admit(r2, r2.key[:2], 4) == 2
    mgr.release(r2, insert=False)                         # nothing registered
    assert sorted(c.blocks) == [0, 1, 2] and pool.available() == 10
    mgr.check()


def test_nocache_release_returns_everything():
    pool = SlotPool(16)
    mgr = CacheManager(NoCache(), pool)
    for insert in (True, False):
        r = CacheReq(key([1, 2, 3]))
        assert mgr.admit(r, r.key, 5) == 0
        mgr.release(r, insert=insert)
        assert pool.available() == 16 and mgr.holders() == []
        assert (r.slots.size, r.cached_len, r.last_node) == (0, 0, None)
        mgr.check()


# ---- reset --------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: RadixCache(page_size=2), lambda: BlockHashCache(block_size=2),
                                  lambda: NoCache(page_size=2)], ids=["radix", "blockhash", "none"])
def test_reset_refuses_while_requests_hold_slots(make):
    cache, pool = make(), SlotPool(32, 2)
    mgr = CacheManager(cache, pool)
    served(mgr, toks(1, 6))
    a, b = CacheReq(key(toks(1, 6))), CacheReq(key([9, 9, 9]))
    assert mgr.admit(a, a.key, 6) is not None and mgr.admit(b, b.key, 3) == 0
    avail, total = pool.available(), cache.total_size()
    snap = tree_snapshot(cache) if isinstance(cache, RadixCache) else None
    with pytest.raises(ValueError, match="2 requests still hold slots"):
        mgr.reset()
    assert (pool.available(), cache.total_size()) == (avail, total)
    assert snap is None or tree_snapshot(cache) == snap
    assert len(mgr.holders()) == 2
    mgr.check()
    mgr.cache_req(a, finished=True)
    with pytest.raises(ValueError, match="1 requests still hold slots"):
        mgr.reset()
    mgr.release(b)
    assert cache.total_size() == (0 if isinstance(cache, NoCache) else 6)
    mgr.reset()
    assert (pool.available(), cache.total_size(), cache.protected_size()) == (32, 0, 0)
    assert cache.match_prefix(key(toks(1, 6)), split=False).prefix_len == 0
    mgr.check()
    c = CacheReq(key(toks(1, 6)))
    assert mgr.admit(c, c.key, 6) == 0 and c.slots.tolist() == list(range(6))
    mgr.check()


def test_lock_cost_counts_only_what_locking_would_protect():
    # radix: a locked path costs nothing; an unlocked partial edge costs its matched part
    mgr, tree, clock = radix(64)
    served(mgr, toks(1, 8))
    k = key(toks(1, 4) + [90])
    peek = tree.match_prefix(k, split=False)
    assert (peek.prefix_len, tree.admission().lock_cost(k, peek.last_node, peek.prefix_len)) == (4, 4)
    holder = CacheReq(key(toks(1, 8)))
    assert mgr.admit(holder, holder.key, 9) == 8          # locks the whole [1..8] edge
    assert tree.admission().lock_cost(k, peek.last_node, peek.prefix_len) == 0
    assert tree.admission().lock_cost(key([]), tree.root, 0) == 0
    # blockhash: the hit blocks still in the free queue
    c = BlockHashCache(block_size=4)
    bmgr = CacheManager(c, SlotPool(64, page_size=4))
    served(bmgr, toks(1, 12))
    m = c.match_prefix(key(toks(1, 12)), split=False)
    assert c.admission().lock_cost(key(toks(1, 12)), m.last_node, m.prefix_len) == 12
    user = CacheReq(key(toks(1, 8)))
    assert bmgr.admit(user, user.key, 9) == 8             # locks blocks 0 and 1
    assert c.admission().lock_cost(key(toks(1, 12)), m.last_node, m.prefix_len) == 4


def test_check_finds_a_lock_no_request_holds():
    # conservation alone could not see a leaked lock: it pins its prefix forever, silently
    mgr, tree, clock = radix(64)
    served(mgr, toks(1, 8))
    r = CacheReq(key(toks(1, 8) + [9]))
    assert mgr.admit(r, r.key[:-1], 9) == 8
    mgr.check()
    node = r.last_node
    tree.inc_lock_ref(node)                                  # taken behind the manager's back
    with pytest.raises(AssertionError, match="the cache holds 2 lock units but its 1 requests hold 1"):
        mgr.check()
    tree.dec_lock_ref(node)
    mgr.check()
    c = BlockHashCache(block_size=4)
    bmgr = CacheManager(c, SlotPool(64, page_size=4))
    served(bmgr, toks(1, 12))
    user = CacheReq(key(toks(1, 12) + [9]))
    assert bmgr.admit(user, user.key[:-1], 13) == 12
    bmgr.check()
    c.inc_lock_ref(c.match_prefix(key(toks(1, 8))).last_node)
    with pytest.raises(AssertionError, match="holds 5 lock units but its 1 requests hold 3"):
        bmgr.check()
