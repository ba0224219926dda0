"""Engine.decode_run (runs of decode steps without plans) changes no result: an engine and a
cluster that step one round at a time through step() and ones that take the runs finish every
request at the same times with the same hits, evictions, steps, timeline and executor time."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from radixkv.config import CacheConfig, EngineConfig
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.cache.key import RadixKey
from radixkv.engine.metrics import RequestRecord
from radixkv.offline.cluster.simulator import ClusterConfig, run_cluster
from radixkv.sched.config import SchedulerConfig
from radixkv.sched.request import Request
from radixkv.sim.costmodel import CostModel
from radixkv.sim.executor import SimExecutor
from radixkv.workloads import TraceRequest, Workload

COST = CostModel.named("llama-3-8b", "h100-sxm")


@st.composite
def workloads(draw) -> Workload:
    """Requests over a few shared prefixes, arriving over a second, most scripted, some with an
    output length only (filler ids), a few with a stop id inside their script; some pin their
    prompt for a while (pins expire inside decode runs: the engine's clock reaches the cache)."""
    prefixes = [tuple(range(1000 * p, 1000 * p + draw(st.integers(0, 60)))) for p in range(3)]
    reqs = []
    for i in range(draw(st.integers(1, 14))):
        prompt = draw(st.sampled_from(prefixes)) + tuple(
            draw(st.lists(st.integers(0, 50), min_size=1, max_size=40)))
        arrival = draw(st.floats(0, 1.0))
        kind = draw(st.sampled_from(["script", "script", "script", "length"]))
        pin = draw(st.sampled_from([0.0, 0.0, 0.0, 0.004, 0.03]))
        if kind == "script":
            n, seed = draw(st.integers(0, 300)), draw(st.integers(0, 60))
            out = tuple((seed + 7 * j) % 61 for j in range(n))
            reqs.append(TraceRequest(f"r{i}", arrival, prompt, output=out, pin_ttl=pin))
        else:
            reqs.append(TraceRequest(f"r{i}", arrival, prompt, output_len=draw(st.integers(1, 60)),
                                     pin_ttl=pin))
    return Workload("w", reqs)


def _stepped(engine: Engine) -> None:
    """The reference: every round through step()."""
    while engine.has_work() and engine.step():
        pass


def _fingerprint(engine: Engine) -> tuple:
    recs = sorted((RequestRecord.of(r) for r in engine.finished), key=lambda r: r.rid)
    return (recs, engine.steps, engine.now, engine.executor.busy_s, engine.timeline,
            engine.manager.evicted_tokens, engine.sched.counters.retractions,
            engine.pool.used(), [list(r.tokens) for r in engine.requests])


def _engine(wl: Workload, page: int, capacity: int, stop: bool, eviction: str = "lru") -> Engine:
    cfg = EngineConfig(kv_capacity=capacity, cache=CacheConfig("radix", page, eviction),
                       sched=SchedulerConfig(chunked_prefill_size=64, max_prefill_tokens=64))
    e = Engine(cfg, cfg.cache.build(), SimExecutor(COST))
    for i, tr in enumerate(wl):
        e.add_request(request_from_trace(tr, i, stop_ids=(7,) if stop and i % 3 == 0 else ()))
    return e


@settings(max_examples=120, deadline=None)
@given(wl=workloads(), page=st.sampled_from([1, 4, 16]), tight=st.booleans(), stop=st.booleans(),
       eviction=st.sampled_from(["lru", "slru", "lfu"]))
def test_an_engine_with_decode_runs_equals_one_stepped_round_by_round(wl, page, tight, stop,
                                                                       eviction):
    need = max(len(tr.prompt) + (tr.output_len or 0) + 2 for tr in wl)
    capacity = -(-(need + (0 if tight else 4000)) // page) * page + page
    a, b = (_engine(wl, page, capacity, stop, eviction), _engine(wl, page, capacity, stop, eviction))
    _stepped(a)
    b.run_until_idle()
    assert _fingerprint(a) == _fingerprint(b)
    b.check_invariants()


def test_a_decode_run_stops_before_a_finish_an_arrival_and_the_horizon():
    cfg = EngineConfig(kv_capacity=128, cache=CacheConfig("radix", 4))
    e = Engine(cfg, cfg.cache.build(), SimExecutor(COST))
    e.add_request(Request("a", list(range(10)), 1, forced_output=list(range(20, 120))))
    e.add_request(Request("late", list(range(50, 54)), 1, arrival=0.2, forced_output=[1]))
    assert e.decode_run() == 0                     # waiting: the next step admits, not a run
    e.step()                                       # prefill of "a": its first token
    a = e.requests[0]
    dt = COST.decode_step_time(1, a.num_computed, a.num_computed)
    assert e.decode_run(horizon=e.now + dt / 2) == 0          # its first step ends too late
    k = e.decode_run()
    last = COST.decode_step_time(1, a.num_computed - 1, a.num_computed - 1)
    assert k > 0 and e.now - last < 0.2 <= e.now   # its last step began before "late" was due
    assert e.decode_run() == 0                     # "late" is due: the next step admits it
    while e.requests[1].status.value != "finished":
        e.step()
    while e.decode_run():
        pass
    assert a.num_output == len(a.forced_output)   # stopped before the step that finishes it
    assert e.requests[1].status.value == "finished" and a.status.value == "running"
    assert e.decode_run(max_steps=e.steps) == 0
    e.run_until_idle()
    assert a.output == list(range(20, 120))


@pytest.mark.parametrize("router", ["round-robin", "llm-d-precise", "radixkv"])
def test_a_cluster_with_decode_runs_routes_and_finishes_as_one_without(router, monkeypatch):
    reqs = [TraceRequest(f"r{i}", 0.05 * i, tuple(range(200 * (i % 3), 200 * (i % 3) + 120))
                         + (i, i + 1), output=tuple(range(i % 7 * 9)))
            for i in range(40)]
    wl = Workload("w", reqs)
    cfg = ClusterConfig(EngineConfig(kv_capacity=800, cache=CacheConfig("radix", 16)), 3)
    fast = run_cluster(wl, cfg, router, COST, check=True)
    monkeypatch.setattr(Engine, "decode_run", lambda self, horizon=math.inf, max_steps=None, evict_events=False: 0)
    slow = run_cluster(wl, cfg, router, COST, check=True)
    assert fast == slow


def test_the_collector_is_paused_for_a_simulation_and_restored_after_it_even_on_error():
    import gc
    from radixkv.offline.replay import collector_paused
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()                 # left as it was found
    finally:
        gc.enable()


def test_a_pin_expiring_inside_a_decode_run_frees_its_prefix_for_that_runs_evictions():
    """Y pinned briefly, X cached after it; a long decode then evicts a page a step once the
    pool is full, well after Y's pin ran out: Y, the older, loses its pages first, in the run
    as in the stepped engine (the run ticks the cache's clock before each eviction)."""
    Y, X, Z = tuple(range(100, 110)), tuple(range(200, 210)), tuple(range(300, 310))
    wl = Workload("w", [
        TraceRequest("y", 0.0, Y, output=(1,), pin_ttl=0.05),
        TraceRequest("x", 0.001, X, output=(1,)),
        TraceRequest("z", 0.01, Z, output=tuple(range(150))),
    ])
    capacity = 10 + 10 + 10 + 150 - 5 + 2      # five pages short at the end of z's decode
    a, b = _engine(wl, 1, capacity, False), _engine(wl, 1, capacity, False)
    _stepped(a)
    b.run_until_idle()
    assert _fingerprint(a) == _fingerprint(b)
    held = [e.manager.peek(RadixKey(p)).prefix_len for e in (a, b) for p in (Y, X)]
    assert held == [6, 10, 6, 10]                   # Y's unpinned pages went, X kept all
