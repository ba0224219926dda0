"""Belady's eviction through FutureOracle: the cached leaf whose next use (the arrival index
of the first not-yet-admitted request covering its first page) is furthest goes first, and
leaves no future request uses go before all of them.

Wiring: FutureOracle(all requests) -> RadixCache(eviction_policy="belady", oracle=oracle),
and the engine's on_admit=oracle.admitted (tests/sched/_helpers.make_engine does this)."""
from __future__ import annotations

import math

import pytest

from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sim.oracle import FutureOracle
from radixkv.sched.request import Request

from ._helpers import logical_clock, make_engine, toks

A, B, C, D = toks(1000, 40), toks(2000, 40), toks(3000, 40), toks(4000, 40)


def scripted(prompts, spacing: float = 0.0):
    return [Request(f"r{i}", p, 0, forced_output=(), arrival=i * spacing, index=i)
            for i, p in enumerate(prompts)]


def belady_cache(reqs, page_size: int = 1):
    oracle = FutureOracle(reqs, page_size)
    cache = RadixCache(page_size=page_size, eviction_policy="belady", oracle=oracle,
                       clock=logical_clock(), evict_granularity="node")    # whole leaves
    return oracle, cache, SlotPool(4096, page_size)


def admit_and_cache(oracle, cache, pool, reqs):
    """What the engine does for a request that prefills and finishes: admitted, then its
    prompt inserted and left unlocked."""
    leaves = []
    for r in reqs:
        oracle.admitted(r)
        slots = pool.alloc(r.prompt_len)
        res = cache.insert(r.prompt_key, slots)
        pool.free(slots[:res.prefix_len])
        leaves.append(res.last_node)
    return leaves


def test_evicts_the_leaf_used_furthest_in_the_future():
    # r0..r2 cache A, B, C; then A is next needed by r3, C by r4, B by r5
    reqs = scripted([A, B, C, A + toks(5000, 5), C + toks(6000, 5), B + toks(7000, 5)])
    oracle, cache, pool = belady_cache(reqs)
    a, b, c = admit_and_cache(oracle, cache, pool, reqs[:3])
    assert [oracle.next_use(n) for n in (a, b, c)] == [3.0, 5.0, 4.0]
    victims = []
    for _ in range(3):
        freed = cache.evict(1)                            # one whole leaf each time
        victims.append(freed.tolist())
        pool.free(freed)
        cache.check_invariants()
    assert victims == [b.value.tolist(), c.value.tolist(), a.value.tolist()]
    pool.check_conservation(cache.held_slots())


def test_never_used_again_goes_first():
    # B has no future user; C's only future user is already admitted
    reqs = scripted([A, B, C, C + toks(6000, 5), A + toks(5000, 5)])
    oracle, cache, pool = belady_cache(reqs)
    a, b, c = admit_and_cache(oracle, cache, pool, reqs[:3])
    oracle.admitted(reqs[3])
    assert oracle.next_use(b) == math.inf and oracle.next_use(a) == 4.0
    cache.inc_lock_ref(c)                                 # re-keys C as it would be now:
    cache.dec_lock_ref(c)                                 # its last user is admitted
    assert oracle.next_use(c) == math.inf
    first = cache.evict(1)
    second = cache.evict(1)
    # both never-used leaves (ties by node id: B is older), then A
    assert first.tolist() == b.value.tolist() and second.tolist() == c.value.tolist()
    assert cache.evict(1).tolist() == a.value.tolist()


def test_next_use_looks_at_the_leaf_first_page():
    # page 4: a leaf that begins mid-prompt is used by whoever covers its first page
    P = toks(100, 16)
    reqs = scripted([P + toks(200, 8), P + toks(300, 8), P + toks(200, 4) + toks(400, 4)],)
    oracle, cache, pool = belady_cache(reqs, page_size=4)
    l0, l1 = admit_and_cache(oracle, cache, pool, reqs[:2])
    # the tree: P (16) -> [200..207] (r0's leaf), [300..307] (r1's leaf)
    assert len(l0.key) == 8 and l0.parent is l1.parent and len(l0.parent.key) == 16
    assert oracle.next_use(l0) == 2.0                    # r2 shares r0's first leaf page
    assert oracle.next_use(l1) == math.inf
    assert oracle.next_use(l0.parent) == 2.0
    assert cache.evict(1).tolist() == l1.value.tolist()


@pytest.mark.parametrize("eviction, hits, evicted", [("belady", [0, 0, 0, 0, 40, 40], 40),
                                                      ("lru", [0, 0, 0, 0, 0, 40], 80)])
def test_engine_belady_keeps_what_will_be_reused(eviction, hits, evicted):
    # one request at a time; D does not fit beside A, B, C: one 40-token leaf must go.
    # B is never used again (Belady evicts it); LRU evicts A, the oldest, which r4 needed,
    # and r4's 50 tokens then need B's room too
    reqs = scripted([A, B, C, D, A + toks(5000, 10), C + toks(6000, 10)], spacing=10.0)
    eng = make_engine(150, CacheConfig("radix", 1, eviction, evict_granularity="node"),
                      SchedulerConfig(chunked_prefill_size=0), check=True, requests=reqs)
    for r in reqs:
        eng.add_request(r)
    rep = eng.run_until_idle()
    assert [r.cached_tokens for r in reqs] == hits
    assert rep.evicted_tokens == evicted
    assert eng.report().cached_tokens == sum(hits)
