"""Closed loop: N clients, each sending its next request when its previous one finishes."""
import pytest

from radixkv.config import EngineConfig
from radixkv.engine.clients import ClosedLoop
from radixkv.engine.engine import Engine
from radixkv.sim.costmodel import CostModel
from radixkv.sim.executor import SimExecutor
from radixkv.sched.request import Status
from radixkv.offline.simulate import build_requests, reference_configs, run_config
from radixkv.workloads import TraceRequest, Workload

SYSTEM = tuple(range(100, 164))


def _workload() -> Workload:
    """Two conversations (a, b) whose turns re-send the earlier replies, a third (c) of one
    turn, and two sessionless requests, interleaved in trace order as a generator would."""
    def turn(sid, k, history, msg, out_len, session):
        out = tuple(range(1000 + 10 * k + 100 * ord(sid[0]), 1000 + 10 * k + 100 * ord(sid[0])
                          + out_len))
        return TraceRequest(f"{sid}{k}", 0.0, SYSTEM + history + msg, output=out,
                            session=session), history + msg + out
    reqs, hist = [], {"a": (), "b": (), "c": ()}
    order = [("a", 0, 5), ("b", 0, 9), (None, 0, 3), ("a", 1, 7), ("c", 0, 2), ("b", 1, 4),
             (None, 1, 6), ("a", 2, 3), ("b", 2, 8)]
    for n, (s, k, out_len) in enumerate(order):
        if s is None:
            reqs.append(TraceRequest(f"x{k}", 0.0, SYSTEM + (7, 8, k), output_len=out_len))
            continue
        tr, hist[s] = turn(s, k, hist[s], (50 + n, 60 + n), out_len, s)
        reqs.append(tr)
    return Workload("tiny", reqs)


def _run(wl: Workload, clients: int, cfg: EngineConfig | None = None):
    cfg = cfg or EngineConfig(kv_capacity=2048)
    reqs = build_requests(wl)
    loop = ClosedLoop(reqs, [tr.session for tr in wl], clients)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named(), on_finish=loop.finished)
    loop.start(eng)
    while eng.has_work():
        if not eng.step():
            break
        eng.check_invariants()
    return eng, loop, reqs


def test_each_request_is_sent_when_its_clients_previous_one_finishes():
    wl = _workload()
    eng, loop, reqs = _run(wl, 2)
    assert all(r.status is Status.FINISHED for r in reqs)
    assert len(eng.finished) == len(reqs) and loop.pending() == 0
    assert sorted(r.index for c in loop.sent for r in c) == list(range(len(reqs)))
    for sent in loop.sent:
        assert sent[0].arrival == 0.0
        for prev, nxt in zip(sent, sent[1:]):
            assert nxt.arrival == prev.finish_time
            assert nxt.arrival > 0.0
        # each client's requests are in trace order
        assert [r.index for r in sent] == sorted(r.index for r in sent)
    # the first two in trace order start the two clients at t=0
    assert [loop.sent[0][0].rid, loop.sent[1][0].rid] == ["a0", "b0"]
    sessions = [tr.session for tr in wl]
    for s in {"a", "b", "c"}:
        owners = {loop.client_of[i] for i, x in enumerate(sessions) if x == s}
        assert len(owners) == 1, s
    # a later turn is sent only after the previous turn's reply exists
    by_rid = {r.rid: r for r in reqs}
    for s in "ab":
        for k in (1, 2):
            assert by_rid[f"{s}{k}"].arrival >= by_rid[f"{s}{k - 1}"].finish_time


def test_assignment_follows_trace_order_with_sessions_held():
    # the whole hand-out, worked out from the rule: a free client sends the earliest request
    # of a session it holds or of a session nobody holds
    eng, loop, reqs = _run(_workload(), 2)
    held = {}
    for c, sent in enumerate(loop.sent):
        for r in sent:
            key = r.rid[0] if r.rid[0] in "abc" else r.rid
            assert held.setdefault(key, c) == c
    assert [r.rid for r in loop.sent[0]][0] == "a0"
    assert "a1" in [r.rid for r in loop.sent[0]] and "a2" in [r.rid for r in loop.sent[0]]
    assert {"b0", "b1", "b2"} <= {r.rid for r in loop.sent[1]}


def test_one_client_runs_the_trace_in_order_back_to_back():
    eng, loop, reqs = _run(_workload(), 1)
    assert [r.index for r in loop.sent[0]] == list(range(len(reqs)))
    assert not eng.sched.has_work()


def test_more_clients_than_sessions_leaves_the_rest_idle():
    wl = _workload()
    eng, loop, reqs = _run(wl, 32)
    assert all(r.status is Status.FINISHED for r in reqs)
    # 5 sessions (a, b, c and the two sessionless requests): 5 clients ever send anything
    assert sum(1 for s in loop.sent if s) == 5
    assert all(s[0].arrival == 0.0 for s in loop.sent if s)


def test_closed_loop_is_deterministic_and_differs_from_open_loop():
    wl = _workload()
    cost = CostModel.named("llama-3-8b", "h100-sxm")
    cfg = EngineConfig(kv_capacity=2048)
    a = run_config(wl, cfg, cost, max_concurrency=2).summary()
    b = run_config(wl, cfg, cost, max_concurrency=2).summary()
    assert a == b
    assert a["requests"] == len(wl)


def test_every_reference_config_runs_closed_loop_belady_included():
    wl = _workload()
    cost = CostModel.named("llama-3-8b", "h100-sxm")
    for nc in reference_configs(1024):
        rep = run_config(wl, nc.cfg.with_(check_invariants=True), cost, max_concurrency=3)
        assert len(rep.records) == len(wl), nc.name


def test_a_request_too_big_for_the_pool_is_refused_before_any_is_sent():
    wl = _workload()
    cfg = EngineConfig(kv_capacity=64)
    reqs = build_requests(wl)
    loop = ClosedLoop(reqs, [tr.session for tr in wl], 2)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named(), on_finish=loop.finished)
    with pytest.raises(ValueError, match="kv_capacity is 64"):
        loop.start(eng)
    assert eng.requests == []


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_bad_client_count_is_refused(n):
    reqs = build_requests(_workload())
    with pytest.raises(ValueError, match="positive int"):
        ClosedLoop(reqs, [None] * len(reqs), n)
