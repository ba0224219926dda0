"""Session arrivals in the engine: each later turn of a session is held back until its
predecessor finished and released a think time after it; the first turn (and a request without
a session) at its own arrival."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.config import EngineConfig
from radixkv.engine.clients import SessionLoop
from radixkv.engine.engine import Engine
from radixkv.offline.simulate import build_requests, reference_configs, run_config
from radixkv.sched.batch import StepResult
from radixkv.sched.request import Status
from radixkv.sim.costmodel import CostModel
from radixkv.sim.executor import SimExecutor
from radixkv.workloads import TraceRequest, Workload, make_workload
from radixkv.workloads.sessions import SessionArrivals

COST = CostModel.named("llama-3-8b", "h100-sxm")


class OneSecondSteps:
    """Every step takes 1 s: a timeline to work out by hand."""
    name, prices_decodes = "one-second", False

    def run(self, plan):
        return StepResult([None] * len(plan.segments), 1.0)

    def release(self, rid):
        pass


def _toy() -> Workload:
    """Two sessions at t=0: a (turn 0 replies 2 tokens, turn 1 replies 1) and b (turn 0
    replies 4 tokens, turn 1 replies nothing). Every turn re-sends the earlier turns."""
    a0, b0 = (1, 2, 3, 4), (9, 8, 7, 6)
    a0_out, b0_out = (11, 12), (21, 22, 23, 24)
    return Workload("toy", [
        TraceRequest("a0", 0.0, a0, output=a0_out, session="a"),
        TraceRequest("b0", 0.0, b0, output=b0_out, session="b"),
        TraceRequest("a1", 0.0, a0 + a0_out + (5,), output=(13,), session="a"),
        TraceRequest("b1", 0.0, b0 + b0_out + (5,), output=(), session="b"),
    ])


def _run(wl, arrivals, executor=None, cfg=None):
    cfg = cfg or EngineConfig(kv_capacity=4096, check_invariants=True)
    reqs = build_requests(wl)
    loop = SessionLoop(reqs, [tr.session for tr in wl], arrivals)
    eng = Engine(cfg, cfg.cache.build(), executor or SimExecutor(COST), on_finish=loop.finished)
    loop.start(eng)
    eng.run_until_idle()
    return eng, loop, reqs


def test_two_sessions_released_by_hand():
    # t=0: a0 and b0 arrive and are prefilled together in step [0, 1] (each samples its first
    # token); decodes [1, 2], [2, 3]: a0 samples its stop at 3 (2 tokens + stop = 3 steps).
    # a1 is released at 3 + 0.5 = 3.5. [3, 4] decodes b0 alone (a1 not due yet); at 4 a1 is
    # admitted: prefill [4, 5] (no decode in a prefill round); [5, 6] decodes a1 (its stop) and
    # b0 (its 5th step: 4 tokens + stop). Both finish at 6; b1 is released at 6.5, idles the
    # engine until then and is prefilled [6.5, 7.5], sampling its stop.
    eng, loop, reqs = _run(_toy(), SessionArrivals(0.5), OneSecondSteps())
    r = {q.rid: q for q in reqs}
    assert [(q.rid, q.arrival, q.first_admit, q.finish_time) for q in reqs] == [
        ("a0", 0.0, 0.0, 3.0), ("b0", 0.0, 0.0, 6.0), ("a1", 3.5, 4.0, 6.0),
        ("b1", 6.5, 6.5, 7.5)]
    assert r["a1"].cached_tokens == 6          # a0's prompt and reply, all but the last token
    assert loop.pending() == 0 and eng.now == 7.5
    rep = eng.report()
    assert sorted((x.rid, x.arrival, x.ttft) for x in rep.records) == [
        ("a0", 0.0, 1.0), ("a1", 3.5, 1.5), ("b0", 0.0, 1.0), ("b1", 6.5, 1.0)]


def test_trace_arrivals_admit_a_later_turn_before_its_reply_exists():
    # the same toy with every turn at its trace arrival (t=0): a1 starts with a0
    reqs = build_requests(_toy())
    cfg = EngineConfig(kv_capacity=4096)
    eng = Engine(cfg, cfg.cache.build(), OneSecondSteps())
    for q in reqs:
        eng.add_request(q)
    eng.run_until_idle()
    r = {q.rid: q for q in reqs}
    assert r["a1"].first_admit < r["a0"].finish_time


def _reference(wl: Workload, think: list[float], finish: dict[str, float]) -> list[float]:
    """Release times, naively: scan back for the previous request of the same session."""
    out = []
    for i, tr in enumerate(wl):
        prev = next((j for j in range(i - 1, -1, -1)
                     if tr.session is not None and wl[j].session == tr.session), None)
        out.append(tr.arrival if prev is None else finish[wl[prev].id] + think[i])
    return out


def _check(wl, arrivals: SessionArrivals, arrival: dict, admitted: dict, finish: dict,
           exact: bool = True) -> None:
    """Release times as the naive reference says (to the bit when `exact`), every request
    admitted no sooner than its release, and no turn before its predecessor finished."""
    assert sorted(arrival) == sorted(tr.id for tr in wl)
    want = _reference(wl, arrivals.draw(len(wl)), finish)
    got = [arrival[tr.id] for tr in wl]
    assert got == (want if exact else pytest.approx(want, rel=1e-12, abs=1e-12))
    slack = 0.0 if exact else 1e-12                # a finish rebuilt as arrival + e2e: an ulp off
    last: dict[str, str] = {}
    for tr in wl:
        assert finish[tr.id] > admitted[tr.id] >= arrival[tr.id]
        if tr.session in last:
            assert admitted[tr.id] >= arrival[tr.id] >= finish[last[tr.session]] - slack
        if tr.session is not None:
            last[tr.session] = tr.id


def _check_requests(wl, arrivals, reqs) -> None:
    assert all(q.status is Status.FINISHED for q in reqs)
    _check(wl, arrivals, {q.rid: q.arrival for q in reqs}, {q.rid: q.first_admit for q in reqs},
           {q.rid: q.finish_time for q in reqs})


def _check_records(wl, arrivals, records) -> None:
    """The same from a report's records (TTFT and E2E counted from the release)."""
    assert all(x.ttft > 0 and x.e2e >= x.ttft for x in records)
    _check(wl, arrivals, {x.rid: x.arrival for x in records},
           {x.rid: x.admitted for x in records}, {x.rid: x.arrival + x.e2e for x in records},
           exact=False)


@st.composite
def _workloads(draw):
    """Up to 14 requests over up to 4 sessions (and some without one), random arrivals and
    lengths; a session's later turn re-sends its earlier turns, as a conversation does."""
    n = draw(st.integers(1, 14))
    sessions = draw(st.lists(st.sampled_from([None, "s0", "s1", "s2", "s3"]),
                             min_size=n, max_size=n))
    arrivals = sorted(draw(st.lists(st.floats(0, 2, allow_nan=False), min_size=n,
                                    max_size=n)))
    history: dict[str, tuple] = {}
    reqs = []
    for i, (s, t) in enumerate(zip(sessions, arrivals)):
        msg = tuple(range(1000 * i + 1, 1000 * i + 1 + draw(st.integers(1, 40))))
        out = tuple(range(1000 * i + 500, 1000 * i + 500 + draw(st.integers(0, 6))))
        prompt = history.get(s, (7, 7, 7)) + msg
        if s is not None:
            history[s] = prompt + out
        reqs.append(TraceRequest(f"r{i}", t, prompt, output=out, session=s))
    return Workload("random", reqs)


_THINK = st.builds(SessionArrivals, st.sampled_from([0.0, 0.003, 0.25]), st.booleans(),
                   st.integers(0, 5))


@settings(max_examples=60, deadline=None)
@given(wl=_workloads(), arrivals=_THINK)
def test_release_times_match_a_naive_reference(wl, arrivals):
    eng, loop, reqs = _run(wl, arrivals)           # invariants checked after every step
    assert loop.pending() == 0 and len(eng.finished) == len(wl)
    _check_requests(wl, arrivals, reqs)
    _check_records(wl, arrivals, eng.report().records)


def test_a_turn_released_at_its_predecessors_finish_checks_out_from_the_records():
    """A record gives a finish time only as arrival + e2e, which can land an ulp past the
    engine's clock: here r2 finishes at 0.11691950710447761 s, its record says ...763, and r3
    is released at the clock's value, exactly its predecessor's finish."""
    s0 = (7, 7, 7) + tuple(range(1, 14))
    r0_out, r2_out = tuple(range(500, 505)), tuple(range(2500, 2506))
    r2 = s0 + r0_out + (2001,)
    wl = Workload("random", [
        TraceRequest("r0", 0.0, s0, output=r0_out, session="s0"),
        TraceRequest("r1", 1.0, (7, 7, 7, 1001), output=()),
        TraceRequest("r2", 1.0, r2, output=r2_out, session="s0"),
        TraceRequest("r3", 1.0, r2 + r2_out + (3001,), output=(), session="s0"),
    ])
    arrivals = SessionArrivals(0.0)
    eng, loop, reqs = _run(wl, arrivals)
    r = {q.rid: q for q in reqs}
    assert r["r3"].arrival == r["r2"].finish_time      # exact, from the requests
    rec = {x.rid: x for x in eng.report().records}
    assert rec["r2"].arrival + rec["r2"].e2e != r["r2"].finish_time
    _check_requests(wl, arrivals, reqs)
    _check_records(wl, arrivals, eng.report().records)


def test_run_config_session_arrivals_on_multiturn():
    wl = make_workload("multiturn", num_users=6, turns=3, seed=1)
    assert {tr.arrival for tr in wl} == {0.0}      # offline: every turn at t=0 in the trace
    arrivals = SessionArrivals(1.5, exponential=True, seed=2)
    rep = run_config(wl, EngineConfig(kv_capacity=20_000, check_invariants=True), COST,
                     arrivals=arrivals)
    _check_records(wl, arrivals, rep.records)
    heads = {x.rid for x in rep.records if x.arrival == 0.0}
    assert heads == {tr.id for tr in wl if tr.id.endswith("-t0")}
    # deterministic, and different from trace arrivals
    assert run_config(wl, EngineConfig(kv_capacity=20_000), COST,
                      arrivals=arrivals).summary() == rep.summary()
    assert run_config(wl, EngineConfig(kv_capacity=20_000), COST).summary() != rep.summary()


def test_every_reference_config_runs_with_session_arrivals():
    wl = make_workload("support", num_users=4, turns=3, rate=2.0)
    for nc in reference_configs(4096):
        rep = run_config(wl, nc.cfg.with_(check_invariants=True), COST,
                         arrivals=SessionArrivals(0.2))
        assert len(rep.records) == len(wl), nc.name


def test_session_arrivals_and_closed_loop_are_refused_together():
    with pytest.raises(ValueError, match="give one or the other"):
        run_config(_toy(), EngineConfig(kv_capacity=4096), COST, max_concurrency=2,
                   arrivals=SessionArrivals())


def test_a_request_too_big_for_the_pool_is_refused_before_any_is_sent():
    reqs = build_requests(_toy())
    cfg = EngineConfig(kv_capacity=8)
    loop = SessionLoop(reqs, [r.session for r in reqs], SessionArrivals())
    eng = Engine(cfg, cfg.cache.build(), OneSecondSteps(), on_finish=loop.finished)
    with pytest.raises(ValueError, match="kv_capacity is 8"):
        loop.start(eng)
    assert eng.requests == [] and loop.pending() == len(reqs)


def test_zero_think_time_releases_at_the_finish():
    eng, _, reqs = _run(_toy(), SessionArrivals(0.0), OneSecondSteps())
    r = {q.rid: q for q in reqs}
    assert r["a1"].arrival == r["a0"].finish_time == 3.0
    assert r["b1"].arrival == r["b0"].finish_time
    assert math.isclose(r["a1"].first_admit, 3.0)
