"""Session turns reach the requests, and the `reuse` eviction order learns from them on a
simulated support agent: exact counters, and less prefill than LRU on the same arrivals."""
from __future__ import annotations

from radixkv.config import CacheConfig, EngineConfig
from radixkv.engine.engine import Engine
from radixkv.sched.request import Request
from radixkv.sim.costmodel import CostModel
from radixkv.sim.executor import SimExecutor
from radixkv.offline.simulate import build_requests, logical_clock
from radixkv.workloads.chat import support


def test_the_engine_counts_a_sessions_turns_in_arrival_order():
    cfg = EngineConfig(kv_capacity=4096)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())
    reqs = [Request("late", list(range(10)), 2, arrival=2.0, session="a"),
            Request("first", list(range(10, 20)), 2, arrival=0.0, session="a"),
            Request("given", list(range(20, 30)), 2, arrival=1.0, session="a", turn=7),
            Request("other", list(range(30, 40)), 2, arrival=1.5, session="b"),
            Request("none", list(range(40, 50)), 2, arrival=0.5)]
    for r in reqs:
        eng.add_request(r)
    eng.run_until_idle()
    assert {r.rid: r.turn for r in reqs} == {"late": 1, "first": 0, "given": 7, "other": 0,
                                             "none": None}


def _run(eviction: str, wl):
    cfg = EngineConfig(kv_capacity=20_000, cache=CacheConfig("radix", 1, eviction))
    cache = cfg.cache.build(clock=logical_clock())
    eng = Engine(cfg, cache, SimExecutor(CostModel.named("llama-3-8b", "h100-sxm")))
    for r in build_requests(wl):
        eng.add_request(r)
    return eng.run_until_idle(), cache


def test_reuse_learns_that_one_shot_retrievals_and_final_turns_are_not_reused():
    wl = support(num_users=40, rate=4.0)           # 5 turns each, plus single-turn RAG
    lru, _ = _run("lru", wl)
    reuse, cache = _run("reuse", wl)
    counters = cache.sort_key.counters
    # RAG: turn 0 behind the 512-token system prompt only; a final turn: turn 4
    assert counters[(0, 10)] == 0 and counters[(4, 12)] == 0
    assert counters[(3, 12)] == 3                  # a fourth turn's path comes back
    assert reuse.prefill_tokens < 0.93 * lru.prefill_tokens   # 193,641 vs 210,425
    cache.check_invariants()
