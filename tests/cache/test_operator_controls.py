"""Pins, retention, cost-aware and queue-aware eviction, and the host tier: exact scenarios,
with the invariants (and slot conservation) checked after every step."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from radixkv.cache.base import CacheReq
from radixkv.cache.host_tier import HostTier
from radixkv.cache.key import RadixKey
from radixkv.cache.manager import CacheManager
from radixkv.cache.orders import CostOrder, analytic_token_cost
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.cache.radix.node import is_candidate
from tests.cache._helpers import FakeClock, all_nodes, toks, tree_snapshot


def serve(mgr: CacheManager, tokens, priority: int = 0, pin_ttl: float = 0.0) -> int:
    """One request through the lifecycle (admit, cache at finish); returns its hit."""
    req = CacheReq(RadixKey(tokens), priority=priority, pin_ttl=pin_ttl)
    hit = mgr.admit(req, req.key[:-1], len(tokens))
    assert hit is not None
    mgr.cache_req(req, finished=True)
    mgr.check()
    return hit


def manager(capacity: int, **cache_kw) -> CacheManager:
    return CacheManager(RadixCache(clock=FakeClock(), **cache_kw), SlotPool(capacity))


# ---- pins ------------------------------------------------------------------------------------
def test_a_pinned_prefix_survives_pressure_until_it_expires():
    mgr = manager(100, max_pinned_tokens=40)
    cache = mgr.cache
    serve(mgr, toks(0, 30))
    assert cache.pins().pin(toks(0, 30), ttl=10.0) == 30
    assert cache.pins().pinned_size() == 30 and cache.stats()["pins"] == 1
    for i in range(1, 6):                          # 5 x 60 tokens through a 100-token pool
        serve(mgr, toks(1000 * i, 60))
        assert serve(mgr, toks(0, 30) + [999]) == 30
    cache.pins().advance(10.0)                            # the deadline: back in the eviction order
    assert cache.pins().pinned_size() == 0
    mgr.check()
    serve(mgr, toks(9000, 90))                     # unpinned: its pages go like any others'
    assert mgr.peek(RadixKey(toks(0, 30))).prefix_len == 10


def test_a_pin_over_budget_changes_nothing():
    mgr = manager(100, max_pinned_tokens=40)
    serve(mgr, toks(0, 30))
    serve(mgr, toks(100, 30))
    mgr.cache.pins().pin(toks(0, 30), ttl=5.0)
    before = tree_snapshot(mgr.cache)
    with pytest.raises(ValueError, match="over max_pinned_tokens 40"):
        mgr.cache.pins().pin(toks(100, 30), ttl=5.0)
    assert tree_snapshot(mgr.cache) == before
    assert mgr.cache.stats()["pins_refused"] == 1
    mgr.cache.pins().pin(toks(0, 20), ttl=5.0)            # inside a pinned path: costs nothing more
    assert mgr.cache.pins().pinned_size() == 30
    assert mgr.cache.pins().unpin(toks(0, 20)) == 20
    with pytest.raises(ValueError, match="not pinned"):
        mgr.cache.pins().unpin(toks(0, 20))
    mgr.check()


def test_pin_ttl_of_a_request_pins_its_prompt_and_the_default_budget_is_a_quarter():
    mgr = manager(200)
    assert mgr.cache.pins().budget == 50
    serve(mgr, toks(0, 40), pin_ttl=3.0)
    assert mgr.cache.pins().pinned_size() == 40
    serve(mgr, toks(500, 40), pin_ttl=3.0)         # over the budget: refused, counted
    assert mgr.cache.pins().pinned_size() == 40 and mgr.cache.stats()["pins_refused"] == 1
    mgr.tick(3.0)
    assert mgr.cache.pins().pinned_size() == 0
    mgr.check()


# ---- priority retention ----------------------------------------------------------------------
@pytest.mark.parametrize("policy, survives", [("lru", False), ("retention", True)])
def test_a_high_priority_prefix_outlives_a_low_priority_flood(policy, survives):
    mgr = manager(200, eviction_policy=policy)
    tenant = toks(0, 50)
    serve(mgr, tenant + [7], priority=2)
    for i in range(1, 20):                         # low-priority traffic, 10 s of it
        mgr.tick(i * 0.5)
        serve(mgr, toks(1000 * i, 40))
    mgr.tick(10.0)
    assert (mgr.peek(RadixKey(tenant)).prefix_len == 50) is survives


# ---- cost-aware eviction (GreedyDual-Size-Frequency) -----------------------------------------
def test_cost_order_evicts_the_cheapest_per_token_first_and_inflates():
    mgr = manager(1000, eviction_policy="cost")
    cache = mgr.cache
    serve(mgr, toks(0, 100))                       # shallow and used once
    serve(mgr, toks(5000, 100))
    serve(mgr, toks(5000, 100) + toks(9000, 100))  # deep: attends over 100 tokens more
    serve(mgr, toks(5000, 100) + [1])
    freed = cache.evict(100)
    assert len(freed) == 100 and mgr.peek(RadixKey(toks(0, 100))).prefix_len == 0
    order = cache.sort_key
    assert order.inflation == pytest.approx(analytic_token_cost(0, 100) / 100)
    assert order(cache.root.children[next(iter(cache.root.children))])[0] > order.inflation


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=25),
       st.integers(10, 120))
def test_cost_order_matches_a_naive_rescan(ops, capacity):
    """Each eviction drops the leaf a full rescan finds cheapest (H = L + f * c / s)."""
    cache = RadixCache(clock=FakeClock(), eviction_policy="cost", evict_granularity="node")
    mgr = CacheManager(cache, SlotPool(capacity + 50))
    order: CostOrder = cache.sort_key
    for prefix, n in ops:
        tokens = toks(prefix * 100, 30)[:max(n, 2)]
        serve(mgr, tokens)
        leaves = [c for c in cache.nodes() if is_candidate(c)]
        if not leaves:
            continue
        expect = min(leaves, key=order)
        freed = cache.evict(1)
        assert expect.parent is None, "the cheapest leaf was not the one evicted"
        mgr.pool.free(freed)
        mgr.check()


# ---- queue-aware eviction ---------------------------------------------------------------------
def test_a_guarded_leaf_goes_last():
    mgr = manager(100)
    serve(mgr, toks(0, 40))                        # least recent: evicted first without a guard
    serve(mgr, toks(100, 40))
    waiting = CacheReq(RadixKey(toks(0, 40) + [5]))
    assert mgr.guard([(waiting, waiting.key[:-1])]) == 1
    mgr.pool.free(mgr.cache.evict(40))
    assert mgr.peek(RadixKey(toks(0, 40))).prefix_len == 40
    assert mgr.peek(RadixKey(toks(100, 40))).prefix_len == 0
    mgr.pool.free(mgr.cache.evict(40))             # nothing else left: the guard yields
    assert mgr.cache.total_size() == 0
    mgr.check()


def test_guarded_leaves_go_furthest_waiter_first_and_an_exposed_parent_inherits_the_rank():
    mgr = manager(100)
    serve(mgr, toks(100, 20))                      # B: the least recent of all
    serve(mgr, toks(0, 20))                        # A
    serve(mgr, toks(0, 20) + toks(500, 20))        # A2, below A
    serve(mgr, toks(200, 20))                      # C: nobody waits for it
    first = CacheReq(RadixKey(toks(100, 20) + [5]))
    second = CacheReq(RadixKey(toks(0, 20) + toks(500, 20) + [5]))
    assert mgr.guard([(first, first.key[:-1]), (second, second.key[:-1])]) == 2
    mgr.pool.free(mgr.cache.evict(60))             # C, then A2 (rank 1) and A (inherits 1)
    assert mgr.peek(RadixKey(toks(100, 20))).prefix_len == 20
    assert mgr.peek(RadixKey(toks(0, 20))).prefix_len == 0
    assert mgr.peek(RadixKey(toks(200, 20))).prefix_len == 0
    mgr.check()
    mgr.cache.check_invariants()


def test_an_exposed_parent_with_its_own_nearer_waiter_keeps_that_rank():
    mgr = manager(100)
    serve(mgr, toks(0, 20))                        # P
    serve(mgr, toks(0, 20) + toks(500, 20))        # Q, below P
    serve(mgr, toks(100, 20))                      # R
    ws = [CacheReq(RadixKey(t + [5])) for t in (toks(0, 20),                  # rank 0: P
                                                toks(100, 20),                # rank 1: R
                                                toks(0, 20) + toks(500, 20))]  # rank 2: Q
    ws[0].key = RadixKey(toks(0, 20) + [7, 8])     # P only (diverges from Q below P)
    assert mgr.guard([(w, w.key[:-1]) for w in ws]) == 3
    mgr.pool.free(mgr.cache.evict(40))             # Q (rank 2); then R (1) before P (own 0)
    assert mgr.peek(RadixKey(toks(0, 20))).prefix_len == 20
    assert mgr.peek(RadixKey(toks(100, 20))).prefix_len == 0
    assert mgr.peek(RadixKey(toks(0, 40))).prefix_len == 20
    mgr.check()


def test_regression_an_exposed_parent_trimmed_in_the_guarded_pass_keeps_one_heap_entry():
    # the exposed parent's entry was in the heap already; the trim pushed it a second time
    mgr = manager(100, evict_granularity="page")
    serve(mgr, toks(0, 10))
    serve(mgr, toks(0, 20))
    cache = mgr.cache
    p = mgr.peek(RadixKey(toks(0, 10))).last_node
    q = mgr.peek(RadixKey(toks(0, 20))).last_node
    assert q.parent is p
    cache.guard().set(lambda n: 0 if n is q else None)
    mgr.pool.free(cache.evict(15))                 # all of q, then 5 trimmed off p
    assert len(p.key) == 5
    assert [e[-1] for e in cache.evictor.heap if e[-2] == p.hv] == [p]
    cache.check_invariants()
    mgr.check()


def test_regression_a_guarded_leaf_trimmed_keeps_one_heap_entry():
    # page granularity trims the guarded leaf; its entry went back to the heap twice
    mgr = manager(100, evict_granularity="page")
    serve(mgr, toks(0, 40))
    waiting = CacheReq(RadixKey(toks(0, 40) + [5]))
    mgr.guard([(waiting, waiting.key[:-1])])
    mgr.pool.free(mgr.cache.evict(10))             # only guarded leaves: 10 trimmed off the end
    node = mgr.peek(RadixKey(toks(0, 30))).last_node
    assert len(node.key) == 30
    assert [e[-1] for e in mgr.cache.evictor.heap if e[-2] == node.hv] == [node]
    mgr.check()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6)), min_size=2, max_size=12),
       st.lists(st.integers(0, 50), max_size=12, unique=True))
def test_eviction_under_a_guard_matches_a_naive_order(prompts, ranks):
    # one leaf per evict(1) (node granularity): unguarded leaves first in LRU order; when only
    # guarded ones are left, the highest rank (distinct here)
    clock = FakeClock()
    tree = RadixCache(clock=clock, evict_granularity="node")
    pool = SlotPool(500)
    for i, (branch, n) in enumerate(prompts):
        clock.t += 1
        key = RadixKey([branch] + toks(100 * i, n))
        slots = pool.alloc(len(key))
        pool.free(slots[:tree.insert(key, slots).prefix_len])
    nodes = sorted((n for n in all_nodes(tree) if n is not tree.root), key=lambda n: n.id)
    rank = {id(n): r for n, r in zip(nodes, ranks)}
    tree.guard().set(lambda n: rank.get(id(n)))
    while tree.evictable_size():
        leaves = [n for n in all_nodes(tree) if n.parent is not None and not n.children]
        free = [n for n in leaves if id(n) not in rank]
        expect = min(free, key=lambda n: (n.last_access, n.id)) if free else \
            max(leaves, key=lambda n: rank[id(n)])
        pool.free(tree.evict(1))
        assert expect.parent is None, "evicted out of the guarded order"
        tree.check_invariants()
        pool.check_conservation(tree.held_slots())


# ---- host tier --------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_an_evicted_prefix_comes_back_from_the_host_tier(policy):
    host = HostTier(400, 1, policy)
    mgr = manager(100, host_tier=host)
    serve(mgr, toks(0, 60))
    serve(mgr, toks(1000, 60))                     # evicts most of the first prompt to the host
    assert mgr.peek(RadixKey(toks(0, 60))).prefix_len < 59
    copies = mgr.take_copies()
    assert copies and all(c.kind == "store" for c in copies)
    req = CacheReq(RadixKey(toks(0, 60) + [1]))
    assert mgr.admit(req, req.key[:-1], 61) == 60  # device part + host part
    assert req.host_loaded > 0
    loads = [c for c in mgr.take_copies() if c.kind == "load"]
    assert sum(len(c.device) for c in loads) == req.host_loaded
    assert list(loads[-1].device) == list(req.slots[60 - req.host_loaded:60])
    mgr.cache_req(req, finished=True)
    mgr.check()
    assert host.stats()["host_hits"] == 1


def test_regression_replay_leaves_no_host_copies_queued():
    """The sequential replay has no executor to run host-tier copies; it used to queue one
    per request forever (memory growing with the trace)."""
    from radixkv.config import CacheConfig
    from radixkv.offline.replay import replay
    from radixkv.workloads import make_workload
    w = make_workload("multiturn", num_users=6, turns=4, msg_len=(8, 24), reply_len=(4, 12),
                      vocab_size=500)
    cache = CacheConfig("radix", 1, "lru", host_kv_tokens=4096).build()
    stats = replay(w, cache, capacity=300, check=True)
    assert stats.evicted_tokens > 0                  # the host tier was in play
    assert cache.host_tier().pending() == 0


def test_regression_a_retracted_request_pins_once():
    """A request with pin_ttl pinned again, under a longer key, each time it was re-admitted
    after a retraction: a second pin spending the budget twice."""
    mgr = manager(400)
    req = CacheReq(RadixKey(toks(0, 40)), pin_ttl=5.0)
    assert mgr.admit(req, req.key[:-1], 40) == 0
    mgr.cache_req(req, finished=False)                # the prompt is pinned
    assert mgr.cache.pins().pinned_size() == 40
    mgr.release(req)                                   # retracted
    req.key = RadixKey(toks(0, 50))                    # it had decoded ten more tokens
    assert mgr.admit(req, req.key[:-1], 50) == 40
    mgr.cache_req(req, finished=False)
    assert mgr.cache.pins().pinned_size() == 40               # still the one pin
    mgr.cache_req(req, finished=True)
    mgr.check()
    mgr.reset()
    assert mgr.cache.pins().pinned_size() == 0
    assert serve(mgr, toks(0, 30)) == 0                # a reset leaves no guard or pin behind
