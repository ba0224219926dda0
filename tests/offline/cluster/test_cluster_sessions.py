"""Session arrivals in the cluster simulator: a later turn reaches the router a think time after
its previous turn finished, and runs that let replicas step ahead of the clock give the same
results as a run where every step goes through it."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.config import CacheConfig, EngineConfig
from radixkv.offline.simulate import build_requests
from radixkv.router import RequestInfo, Router, make_router
from radixkv.offline.cluster.simulator import Cluster, ClusterConfig, run_cluster
from radixkv.offline.cluster.compare import run_routers
from radixkv.sched.request import Status
from radixkv.sim.costmodel import CostModel
from radixkv.workloads import TraceRequest, Workload, make_workload
from radixkv.workloads.sessions import ArrivalQueue, SessionArrivals

COST = CostModel.named("llama-3-8b", "h100-sxm")
CFG = ClusterConfig(EngineConfig(kv_capacity=12_000, cache=CacheConfig("radix", 16)), 3, seed=3)
MULTI = make_workload("multiturn", num_users=8, turns=3, seed=2)        # every turn at t=0
SUPPORT = make_workload("support", num_users=10, turns=3, rate=6.0)


class Recorder(Router):
    """Round-robin, remembering each routing (with the arrival the router saw) and finish."""
    name = "recorder"
    uses_events = False

    def __init__(self, context, options=None):
        super().__init__(context, options)
        self.calls: list[tuple] = []

    def route(self, request: RequestInfo, replicas) -> int:
        self.calls.append(("route", request.rid, request.arrival))
        return len(self.calls) % self.n

    def on_finish(self, replica, request):
        self.calls.append(("finish", request.rid))


def _run(wl, arrivals, router=None, config=CFG):
    router = router or Recorder(config.context(COST))
    cluster = Cluster(config, router, COST)
    reqs = build_requests(wl)
    cluster.run([(q, tr.session) for q, tr in zip(reqs, wl)], arrivals=arrivals)
    cluster.check()
    return cluster, router, reqs


def _reference(wl, think, finish):
    """Release times, naively: the previous request of the same session, scanned for."""
    out = []
    for i, tr in enumerate(wl):
        prev = [j for j in range(i) if tr.session is not None and wl[j].session == tr.session]
        out.append(tr.arrival if not prev else finish[wl[prev[-1]].id] + think[i])
    return out


def _check(wl, arrivals, reqs, router=None):
    assert all(q.status is Status.FINISHED for q in reqs)
    by_id = {q.rid: q for q in reqs}
    finish = {q.rid: q.finish_time for q in reqs}
    want = _reference(wl, arrivals.draw(len(wl)), finish)
    assert [by_id[tr.id].arrival for tr in wl] == want
    last: dict[str, str] = {}
    for tr in wl:
        q = by_id[tr.id]
        assert q.first_admit >= q.arrival
        if tr.session in last:
            assert q.first_admit >= finish[last[tr.session]]
        if tr.session is not None:
            last[tr.session] = tr.id
    if router is not None:
        # the router sees each request once, at its release, after its predecessor finished
        routed = [c for c in router.calls if c[0] == "route"]
        assert sorted(c[1] for c in routed) == sorted(tr.id for tr in wl)
        assert all(a == by_id[rid].arrival for _, rid, a in routed)
        assert [a for _, _, a in routed] == sorted(a for _, _, a in routed)
        order = {c[:2]: k for k, c in enumerate(router.calls)}
        last = {}
        for tr in wl:
            if tr.session in last:
                assert order[("finish", last[tr.session])] < order[("route", tr.id)]
            if tr.session is not None:
                last[tr.session] = tr.id


def test_later_turns_reach_the_router_after_the_previous_reply():
    arrivals = SessionArrivals(0.8)
    cluster, router, reqs = _run(MULTI, arrivals)
    _check(MULTI, arrivals, reqs, router)
    firsts = [c for c in router.calls if c[0] == "route"][:8]
    assert {c[1] for c in firsts} == {tr.id for tr in MULTI if tr.id.endswith("-t0")}
    assert all(c[2] == 0.0 for c in firsts)
    assert min(q.arrival for q in reqs if not q.rid.endswith("-t0")) > 0.8


def _all_steps_on_the_clock(monkeypatch):
    """The reference semantics: no replica steps ahead of the clock (horizon = now)."""
    monkeypatch.setattr(ArrivalQueue, "floor", lambda self: 0.0)


@pytest.mark.parametrize("router", ["radixkv", "llm-d-precise", "power-of-two"])
@pytest.mark.parametrize("think", [SessionArrivals(0.0), SessionArrivals(0.3, True, 1)])
def test_stepping_ahead_gives_the_results_of_the_clock(monkeypatch, router, think):
    fast = run_cluster(SUPPORT, CFG, router, COST, check=True, arrivals=think)
    _all_steps_on_the_clock(monkeypatch)
    assert run_cluster(SUPPORT, CFG, router, COST, check=True, arrivals=think) == fast


def test_trace_arrivals_stepping_ahead_is_the_clock_too(monkeypatch):
    # the reference itself: with trace arrivals, quiet steps were always exact
    fast = run_cluster(SUPPORT, CFG, "radixkv", COST)
    _all_steps_on_the_clock(monkeypatch)
    assert run_cluster(SUPPORT, CFG, "radixkv", COST) == fast


def test_session_arrivals_differ_from_trace_arrivals_and_are_deterministic():
    a = run_cluster(MULTI, CFG, "radixkv", COST, arrivals=SessionArrivals(1.0))
    assert run_cluster(MULTI, CFG, "radixkv", COST, arrivals=SessionArrivals(1.0)) == a
    assert run_cluster(MULTI, CFG, "radixkv", COST) != a
    assert run_cluster(MULTI, CFG, "radixkv", COST, arrivals=None) == \
        run_cluster(MULTI, CFG, "radixkv", COST)
    assert run_routers(MULTI, CFG, ["radixkv"], COST, arrivals=SessionArrivals(1.0)) == [a]


@st.composite
def _workloads(draw):
    n = draw(st.integers(1, 12))
    sessions = draw(st.lists(st.sampled_from([None, "s0", "s1", "s2"]), min_size=n,
                             max_size=n))
    times = sorted(draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    history: dict[str, tuple] = {}
    out = []
    for i, (s, t) in enumerate(zip(sessions, times)):
        prompt = history.get(s, (3,) * 16) + tuple(range(100 * i + 1, 100 * i + 1 +
                                                        draw(st.integers(1, 60))))
        reply = tuple(range(100 * i + 70, 100 * i + 70 + draw(st.integers(0, 8))))
        if s is not None:
            history[s] = prompt + reply
        out.append(TraceRequest(f"r{i}", t, prompt, output=reply, session=s))
    return Workload("random", out)


@settings(max_examples=25, deadline=None)
@given(wl=_workloads(), think=st.sampled_from([0.0, 0.002, 0.05]), exp=st.booleans(),
       router=st.sampled_from(["radixkv", "round-robin"]))
def test_release_times_match_a_naive_reference(wl, think, exp, router):
    arrivals = SessionArrivals(think, exp, 7)
    config = ClusterConfig(EngineConfig(kv_capacity=4096, cache=CacheConfig("radix", 16)), 2)
    _, _, reqs = _run(wl, arrivals, make_router(router, config.context(COST)), config)
    _check(wl, arrivals, reqs)
