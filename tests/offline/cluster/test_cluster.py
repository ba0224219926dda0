"""The cluster simulator: deterministic for a seed, every replica's books balanced at the end,
and the figures consistent with the requests."""
from __future__ import annotations

import pytest

from radixkv.config import CacheConfig, EngineConfig
from radixkv.router import RequestInfo, Router, make_router
from radixkv.offline.cluster.simulator import Cluster, ClusterConfig, run_cluster
from radixkv.sim.costmodel import CostModel
from radixkv.offline.simulate import build_requests
from radixkv.workloads import make_workload

COST = CostModel.named("llama-3-8b", "h100-sxm")
WL = make_workload("support", num_users=12, turns=3, rate=8.0)
CFG = ClusterConfig(EngineConfig(kv_capacity=12_000, cache=CacheConfig("radix", 16)), 3, seed=3)


@pytest.mark.parametrize("name", ["power-of-two", "radixkv"])
def test_same_seed_same_result(name):
    a, b = (run_cluster(WL, CFG, name, COST) for _ in range(2))
    assert a == b
    assert a.evicted_tokens > 0                # the pools are small enough to evict


class Recorder(Router):
    """Round-robin, remembering every hook call."""
    name = "recorder"
    uses_events = True

    def __init__(self, context, options=None):
        super().__init__(context, options)
        self.calls: list[tuple] = []
        self.i = 0

    def route(self, request: RequestInfo, replicas) -> int:
        self.check_views(replicas)
        self.i += 1
        return self.i % self.n

    def on_route(self, replica, request):
        self.calls.append(("route", replica, request.rid))

    def on_events(self, replica, events):
        self.calls.append(("events", replica, len(events)))

    def on_ttft(self, replica, request, seconds):
        self.calls.append(("ttft", replica, request.rid, seconds))

    def on_first_token(self, replica, request):
        self.calls.append(("first", replica, request.rid))

    def on_finish(self, replica, request):
        self.calls.append(("finish", replica, request.rid))


def test_hooks_in_order_and_every_replica_conserves():
    router = Recorder(CFG.context(COST))
    cluster = Cluster(CFG, router, COST)
    reqs = build_requests(WL)
    cluster.run([(q, None) for q in reqs])
    cluster.check()                                    # manager.check() on every replica
    seen: dict[str, list[str]] = {}
    ttft = {}
    for kind, replica, rid, *rest in router.calls:
        if kind != "events":
            seen.setdefault(rid, []).append(kind)
        if kind == "ttft":
            ttft[rid] = rest[0]
    assert all(v == ["route", "ttft", "first", "finish"] for v in seen.values())
    assert len(seen) == len(reqs)
    done = {q.rid: q for rep in cluster.replicas for q in rep.engine.finished}
    assert ttft == {rid: q.first_token - q.arrival for rid, q in done.items()}
    assert any(k == "events" for k, *_ in router.calls)
    per_replica = [len(rep.engine.finished) for rep in cluster.replicas]
    assert sum(per_replica) == len(reqs) and min(per_replica) > 0
    assert all(rep.view.waiting == rep.view.running == 0 for rep in cluster.replicas)


def test_figures_add_up():
    res = run_cluster(WL, CFG, "round-robin", COST, check=True)
    prompt = sum(len(tr.prompt) for tr in WL)
    assert res.details["prompt_tokens"] == prompt
    assert res.prefill_tokens >= prompt * (1 - res.hit_rate) - 1
    assert sum(res.replica_tokens) == res.prefill_tokens + res.details["output_tokens"]
    assert res.imbalance == pytest.approx(max(res.replica_tokens) * 3 / sum(res.replica_tokens))
    assert res.ttft_p50 <= res.ttft_p99 <= res.e2e_p99


def test_cache_affinity_beats_round_robin_on_hits():
    rr = run_cluster(WL, CFG, "round-robin", COST)
    assert run_cluster(WL, CFG, "radixkv", COST).hit_rate > rr.hit_rate
    assert run_cluster(WL, CFG, "session-hash", COST).hit_rate > rr.hit_rate


def test_a_request_no_replica_holds_is_refused():
    small = ClusterConfig(EngineConfig(kv_capacity=256, cache=CacheConfig("radix", 16)), 2)
    with pytest.raises(ValueError, match="kv_capacity is 256"):
        run_cluster(WL, small, "round-robin", COST)


def test_router_of_another_size_is_refused():
    with pytest.raises(ValueError, match="routes over 2 replicas"):
        Cluster(CFG, make_router("round-robin", CFG.context(COST).__class__(2)), COST)


@pytest.mark.parametrize("name", ["llm-d-precise", "radixkv"])
def test_at_every_route_the_router_holds_what_each_cache_held_at_its_last_step_end(
        name, monkeypatch):
    """Quiet steps leave their KV events for the next route: the index a router reads is, to
    the page, each replica's cache as of its last step ended by the arrival (a step still
    running then is not heard yet), with pages under eviction pressure coming and going."""
    from radixkv.engine.engine import Engine
    states: dict[int, list[tuple[float, frozenset]]] = {}
    step, decode_run = Engine.step, Engine.decode_run

    def record(engine):
        states.setdefault(id(engine), []).append((engine.now, frozenset(engine.cache.events().page_hashes())))

    def stepped(self):
        out = step(self)
        record(self)
        return out

    def ran(self, *a, **kw):
        k = decode_run(self, *a, **kw)
        if k:
            record(self)
        return k

    monkeypatch.setattr(Engine, "step", stepped)
    monkeypatch.setattr(Engine, "decode_run", ran)
    cfg = ClusterConfig(EngineConfig(kv_capacity=4_096, cache=CacheConfig("radix", 16)), 3)
    router = make_router(name, cfg.context(COST))
    cluster = Cluster(cfg, router, COST)
    checked = []
    route = type(router).route

    def checking(self, request, replicas):
        for rep, index in zip(cluster.replicas, self.index.indexes):
            held = [s for t, s in states.get(id(rep.engine), []) if t <= request.arrival]
            assert index.hashes() == (held[-1] if held else frozenset())
        checked.append(request.rid)
        return route(self, request, replicas)

    monkeypatch.setattr(type(router), "route", checking)
    reqs = build_requests(WL)
    cluster.run([(q, None) for q in reqs])
    assert len(checked) == len(reqs)
    assert sum(rep.engine.manager.evicted_tokens for rep in cluster.replicas) > 0
