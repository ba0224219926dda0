"""Queue orders and eviction orders are open registries: an order registered from Python is
accepted by the configs and used by the scheduler and the cache like a built-in one."""
from __future__ import annotations

import pytest

from radixkv.cache.policies import EVICTION_POLICIES
from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sched.policy import QUEUE_ORDERS
from radixkv.sched.request import Request

from ._helpers import admitted_order, make_engine, make_scheduler, toks, warm


@pytest.fixture
def shortest_prompt_first():
    @QUEUE_ORDERS.register("shortest-prompt")
    def order(waiting, ctx):                     # a user's order: shortest prompt first
        return sorted(waiting, key=lambda r: (r.prompt_len, r.index))
    yield "shortest-prompt"
    QUEUE_ORDERS.remove("shortest-prompt")


@pytest.fixture
def longest_edge_first():
    @EVICTION_POLICIES.register("longest-edge")
    def key(n) -> tuple:                         # a user's order: the longest leaf goes first
        return (-len(n.key), n.id)
    yield "longest-edge"
    EVICTION_POLICIES.remove("longest-edge")


def test_a_registered_queue_order_orders_admission(shortest_prompt_first):
    s = make_scheduler(policy=shortest_prompt_first)
    for i, n in enumerate((30, 10, 20)):
        s.add(Request(f"r{n}", toks(1000 * i, n), 2, arrival=float(i), index=i))
    assert admitted_order(s) == [("r10", 0), ("r20", 0), ("r30", 0)]
    with pytest.raises(ValueError, match="unknown queue policy 'nope'; valid: .*shortest-prompt"):
        SchedulerConfig(policy="nope")


def test_a_registered_eviction_order_chooses_the_victims(longest_edge_first):
    eng = make_engine(64, CacheConfig("radix", 1, longest_edge_first, evict_granularity="node"),
                      SchedulerConfig(chunked_prefill_size=0, max_running_requests=1))
    s = eng.sched
    warm(s, toks(0, 10))
    warm(s, toks(100, 30))
    warm(s, toks(200, 20))
    assert s.mgr.cache.total_size() == 60
    freed = s.mgr.alloc(35)                      # 4 free: evicts 30 (the longest), then 20
    assert s.mgr.evicted_tokens == 50
    assert s.mgr.cache.match_prefix(toks(0, 10), split=False).prefix_len == 10
    assert s.mgr.cache.match_prefix(toks(100, 30), split=False).prefix_len == 0
    s.mgr.pool.free(freed)
    s.mgr.check()


def test_registry_remove_names_the_unknown():
    with pytest.raises(ValueError, match="unknown queue policy 'ghost'"):
        QUEUE_ORDERS.remove("ghost")
