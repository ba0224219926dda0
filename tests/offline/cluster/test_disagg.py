"""The disaggregated cluster simulator: a request's times to the bit (prefill, the transfer over
the link, the decode worker's steps), transfers queued on a worker's link, the decode worker
chosen by load, the prefill router told of the link, books balanced, bad configs refused."""
from __future__ import annotations

import json

import pytest

from radixkv.cli import main
from radixkv.config import CacheConfig, EngineConfig
from radixkv.engine.metrics import itl_percentiles
from radixkv.router import ReplicaView, RequestInfo, RouterContext, make_router
from radixkv.offline.cluster.simulator import ClusterConfig, run_cluster
from radixkv.offline.cluster.disagg import (DisaggCluster, DisaggConfig, decode_engine, run_disagg,
                                   twins_of)
from radixkv.sim.costmodel import CostModel
from radixkv.sim.decode_worker import DecodeWorkerCost
from radixkv.sim.kv_links import KV_LINKS, KVLink, LinkQueue
from radixkv.workloads import TraceRequest, make_workload

COST = CostModel.named("llama-3-8b", "h100-sxm")
K = COST.model_spec.kv_bytes_per_token_per_gpu
RDMA = KV_LINKS.get("rdma")
ENG = EngineConfig(kv_capacity=12_000, cache=CacheConfig("radix", 16))


def disagg(p: int, d: int, **kw) -> DisaggConfig:
    return DisaggConfig(ENG, decode_engine(ENG), p, d, **kw)


def build(cfg: DisaggConfig, router: str = "round-robin") -> DisaggCluster:
    rt = make_router(router, cfg.prefill_pool().context(COST))
    drt = make_router(cfg.decode_router, cfg.decode_pool().context(DecodeWorkerCost(COST)))
    return DisaggCluster(cfg, rt, COST, drt)


def req(i: int, n: int = 1000, out: int = 5, t: float = 0.0) -> TraceRequest:
    base = 1 + 10_000 * i
    return TraceRequest(f"r{i}", t, tuple(range(base, base + n)), output_len=out)


def test_one_request_to_the_bit():
    c = build(disagg(1, 1))
    (tw,) = c.run(twins_of([req(0)]))
    t1 = COST.step_time([(0, 1000)], ())                        # prefill and first token
    landed = t1 + 1000 * K / RDMA.achieved_Bps + RDMA.latency_s
    t3 = landed + COST.step_time((), [999])                     # joins the decode batch
    end = t3
    for ctx in range(1000, 1004):                               # tokens 2..5
        end += COST.step_time((), [ctx])
    assert (tw.pre.finish_time, tw.start, tw.landed) == (t1, t1, pytest.approx(landed, rel=1e-12))
    assert tw.dec.first_token == pytest.approx(t3, rel=1e-12)
    rec = tw.record()
    assert rec.ttft == pytest.approx(t3, rel=1e-12) and rec.e2e == pytest.approx(end, rel=1e-12)
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens, rec.prefill_tokens) == \
        (1000, 5, 0, 1000)
    c.check()
    for pool in (c.pre, c.dec):                   # nothing held: used slots are the tree's
        for rep in pool.replicas:
            assert rep.engine.sched.num_admitted == 0


@pytest.fixture
def slow_link():
    KV_LINKS.add("slow-test", KVLink("slow-test", 2e9, 1e9, 1e-4))
    yield KV_LINKS.get("slow-test")
    KV_LINKS.remove("slow-test")


def test_transfers_queue_on_one_link_and_decode_goes_by_load(slow_link):
    c = build(disagg(1, 2, link="slow-test"))
    a, b = c.run(twins_of([req(0, out=200), req(1, out=200)]))
    t1 = COST.step_time([(0, 1000)], ())
    # both arrive at 0: a's step starts at once, b's after it
    assert (a.pre.finish_time, b.pre.finish_time) == (t1, pytest.approx(2 * t1, rel=1e-12))
    busy = 1000 * K / slow_link.achieved_Bps                        # 131 ms > t1
    assert a.start == t1 and a.landed == pytest.approx(t1 + busy + 1e-4, rel=1e-12)
    assert b.start == pytest.approx(t1 + busy, rel=1e-12)           # behind a's bytes
    assert b.landed == pytest.approx(t1 + 2 * busy + 1e-4, rel=1e-12)
    # least load: a lands on an idle pool (decode worker 0), b on the one not holding a (a
    # still decodes its 200 tokens)
    held = [[q.rid for q in rep.engine.finished] for rep in c.dec.replicas]
    assert held == [["r0"], ["r1"]]
    assert c.links[0].sent_tokens == 2000
    assert c.pre.replicas[0].view.link_free_at == pytest.approx(t1 + 2 * busy, rel=1e-12)


def test_a_shared_prefix_hits_on_the_prefill_worker():
    shared = tuple(range(1, 801))
    wl = [TraceRequest("a", 0.0, shared + (5001,) * 200, output_len=3),
          TraceRequest("b", 5.0, shared + (6001,) * 200, output_len=3)]
    res = run_disagg(wl, disagg(1, 1), "round-robin", COST, check=True)
    assert res.details["cached_tokens"] == 800            # b's 50 whole pages on the worker
    assert res.prefill_tokens == 2000 - 800
    assert res.details["pools"]["transfer"]["tokens"] == 2000    # whole prompts move


def test_the_prefill_router_waits_for_a_busy_link():
    rt = make_router("radixkv", RouterContext(2, 16, cost=COST))
    info = RequestInfo("x", list(range(1, 513)), arrival=10.0, max_new_tokens=4)
    idle = [ReplicaView(kv_capacity=10_000), ReplicaView(kv_capacity=10_000)]
    assert rt.route(info, idle) == 0                       # a tie: the lower index
    busy0 = [ReplicaView(kv_capacity=10_000, link_free_at=11.0), ReplicaView(kv_capacity=10_000)]
    assert rt.route(info, busy0) == 1                      # worker 0's link is busy for 1 s


def test_same_seed_same_result_and_books_balance():
    wl = make_workload("support", num_users=8, turns=2, rate=6.0)
    cfg = disagg(2, 2)
    a, b = (run_disagg(wl, cfg, "radixkv", COST, check=True) for _ in range(2))
    assert a == b
    pools = a.details["pools"]
    assert pools["prefill"]["replicas"] == 2 and pools["decode"]["replicas"] == 2
    assert a.details["requests"] == len(wl)
    assert a.details["itl_p99"] == pools["decode"]["itl_p99"] > 0


def test_kv_link_and_queue():
    link = KVLink("t", 10e9, 8e9, 1e-3)
    assert link.transfer_time(1000, 1000) == pytest.approx(1e-3 + 1e6 / 8e9)
    q = LinkQueue(link, 1000)
    assert q.send(1.0, 8000) == (1.0, pytest.approx(1.002))         # 1 ms of bytes, 1 ms latency
    assert q.send(1.0, 8000) == (pytest.approx(1.001), pytest.approx(1.003))
    assert q.send(5.0, 8000)[0] == 5.0
    with pytest.raises(ValueError, match="achieved"):
        KVLink("bad", 1e9, 2e9, 0.0)


def test_decode_worker_prices_prompts_as_decodes():
    cost = DecodeWorkerCost(COST)
    assert cost.step_time([(0, 1000), (200, 300)], [700]) == COST.step_time((), [700, 999, 499])
    assert cost.decode_step_time(3, 2100, 800) == COST.decode_step_time(3, 2100, 800)


def test_itl_from_timelines():
    # steps end at 1, 2, 4, 4.5: running before each gap 2, 0, 3
    tl = {"t": [1.0, 2.0, 4.0, 4.5], "running": [2, 0, 3, 0]}
    assert itl_percentiles([tl], (50, 99)) == [0.5, 1.0]     # gaps 1.0 x2, 0.5 x3; idle 2.0 skipped
    assert itl_percentiles([{"t": [1.0], "running": [1]}]) == [None, None]


def test_aggregated_rows_carry_itl():
    wl = make_workload("support", num_users=4, turns=2, rate=6.0)
    res = run_cluster(wl, ClusterConfig(ENG, 2), "round-robin", COST)
    assert res.details["itl_p50"] <= res.details["itl_p99"]


@pytest.mark.parametrize("kw, msg", [
    ({"p": 0, "d": 1}, "prefill_replicas must be a positive int, got 0"),
    ({"p": 1, "d": 0}, "decode_replicas must be a positive int, got 0"),
    ({"p": 1, "d": 1, "link": "carrier-pigeon"}, "unknown KV link 'carrier-pigeon'"),
    ({"p": 1, "d": 1, "decode_router": "nope"}, "unknown router 'nope'"),
])
def test_bad_configs(kw, msg):
    p, d = kw.pop("p"), kw.pop("d")
    with pytest.raises(ValueError, match=msg):
        disagg(p, d, **kw)


def test_pages_must_agree():
    other = EngineConfig(kv_capacity=12_000, cache=CacheConfig("radix", 32))
    with pytest.raises(ValueError, match="prefill pages of 16 tokens and decode pages of 32"):
        DisaggConfig(ENG, other, 1, 1)


SMALL = ["cluster", "support", "--users", "6", "--turns", "2", "--workers", "1"]


def test_cli_disaggregated(tmp_path, capsys):
    out = tmp_path / "d.json"
    rc = main([*SMALL, "--prefill-replicas", "2", "--decode-replicas", "1", "--kv-link",
               "nvlink", "--router", "round-robin", "radixkv", "--json", str(out)])
    text, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert "2 prefill + 1 decode replicas (nvlink, decode by least-load)" in text
    doc = json.loads(out.read_text())
    assert (doc["prefill_replicas"], doc["decode_replicas"], doc["kv_link"]) == (2, 1, "nvlink")
    assert [r["router"] for r in doc["results"]] == ["round-robin", "radixkv"]
    assert doc["results"][0]["details"]["pools"]["transfer"]["link"] == "nvlink"


@pytest.mark.parametrize("argv, line", [
    (["--prefill-replicas", "2"], "a disaggregated cluster needs both --prefill-replicas and "
                                  "--decode-replicas"),
    (["--prefill-replicas", "2", "--decode-replicas", "2", "--replicas", "3"],
     "--replicas 3 conflicts with --prefill-replicas"),
    (["--kv-link", "nvlink"], "--kv-link nvlink applies to a disaggregated cluster"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "x"],
     "unknown KV link 'x'"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--arrivals", "session"],
     "session arrivals are not simulated on a disaggregated cluster"),
])
def test_cli_bad_flags(capsys, argv, line):
    rc = main([*SMALL, "--router", "round-robin", *argv])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith(f"radixkv cluster: error: {line}"), err
