"""One lifecycle: a sequential replay and an engine run with one request at a time and no
chunking make the same CacheManager calls in the same order, so they see the same hits —
request by request, with and without eviction, for every cache design."""
from __future__ import annotations

import dataclasses

import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.offline.replay import replay
from radixkv.workloads import make_workload

from tests.sched._helpers import logical_clock, make_engine, requests_of

WORKLOADS = {
    "support": dict(num_users=8, turns=3, system_len=120, fewshot_len=200, rag_len=150,
                    msg_len=(5, 40), reply_len=(1, 40)),
    "multiturn": dict(num_users=8, turns=4, system_len=30, msg_len=(5, 40), reply_len=(0, 50)),
}
# replay has no queue: queue-aware eviction (on by default) would guard what later requests hit
ONE_AT_A_TIME = SchedulerConfig(max_running_requests=1, chunked_prefill_size=0, dedup=False,
                                queue_aware_eviction=False)


def unscripted(w):
    """The workload with its recorded replies dropped: only their lengths remain."""
    return [dataclasses.replace(r, output=None) for r in w]


@pytest.mark.parametrize("cache", [CacheConfig("radix", 1), CacheConfig("radix", 16),
                                   CacheConfig("radix", 1, "lfu"), CacheConfig("radix", 1, "reuse"),
                                   CacheConfig("blockhash", 16),
                                   CacheConfig("none", 1)], ids=lambda c: c.label)
@pytest.mark.parametrize("pressure", [False, True], ids=["unlimited", "evicting"])
@pytest.mark.parametrize("name", sorted(WORKLOADS) + ["multiturn-lengths-only"])
def test_replay_and_engine_see_the_same_hits(name, pressure, cache):
    # lengths only (a trace that records no reply): the engine samples filler and never feeds
    # its last token back; replay used to store that token too, and evictions drifted
    w = (unscripted(make_workload("multiturn", **WORKLOADS["multiturn"]))
         if name == "multiturn-lengths-only" else make_workload(name, **WORKLOADS[name]))
    ps = cache.page_size
    longest = max(len(r.prompt) + r.output_len + 1 for r in w)      # the engine's own check
    capacity = -(-longest // ps) * ps + 4 * ps if pressure else None
    extra = {"clock": logical_clock()} if cache.kind == "radix" else {}
    stats = replay(w, cache.build(**extra), capacity, check=True)

    eng = make_engine(stats.capacity, cache, ONE_AT_A_TIME, check=True)
    for r in requests_of(w):
        eng.add_request(r)
    eng.run_until_idle()
    engine_hits = tuple(r.cached_tokens for r in sorted(eng.finished, key=lambda r: r.index))

    assert engine_hits == stats.hits
    assert eng.manager.evicted_tokens == stats.evicted_tokens
    assert eng.sched.counters.retractions == 0
    if pressure and cache.kind != "none":
        assert stats.evicted_tokens > 0                 # the pressure case really evicts
    if cache.kind != "none":
        assert stats.hit_tokens > 0
