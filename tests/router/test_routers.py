"""Each router on hand-built states: the replica it must pick."""
from __future__ import annotations

import pytest

from radixkv.cache.events import KVEvent, chain_hash
from radixkv.cache.key import RadixKey
from radixkv.kvevents.wire import encode_batch, decode_batch, to_wire
from radixkv.router import ReplicaView, RequestInfo, RouterContext, make_router
from radixkv.router.sglang import SGLangOptions
from radixkv.sim.costmodel import CostModel

PS = 4
COST = CostModel.named("llama-3-8b", "h100-sxm")


def ctx(n: int, **kw) -> RouterContext:
    return RouterContext(n, page_size=PS, cost=COST, **kw)


def req(rid: str, tokens, session=None, t=0.0) -> RequestInfo:
    return RequestInfo(rid, list(tokens), session=session, arrival=t)


def idle(n: int) -> list[ReplicaView]:
    return [ReplicaView(kv_capacity=10_000)] * n


def stored(tokens) -> list[KVEvent]:
    """The events a radix cache with page PS emits when it stores `tokens`' whole pages."""
    key, out, parent = RadixKey(tokens), [], None
    for i in range(len(tokens) // PS):
        h = chain_hash(parent, key.namespace, key.page(i, PS))
        out.append(KVEvent("stored", h, parent, tuple(tokens[i * PS:(i + 1) * PS]),
                           key.namespace))
        parent = h
    return out


def test_round_robin_cycles():
    r = make_router("round-robin", ctx(3))
    assert [r.route(req(f"r{i}", [1, 2]), idle(3)) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_power_of_two_picks_the_shorter_of_its_two_draws():
    import random
    views = [ReplicaView(waiting=q) for q in (5, 1, 9, 3)]
    r = make_router("power-of-two", ctx(4, seed=7))
    rng = random.Random(7)
    for i in range(20):
        a, b = rng.sample(range(4), 2)
        want = b if views[b].queue_len < views[a].queue_len else a
        assert r.route(req(f"r{i}", [1]), views) == want


def test_least_load_and_session_hash():
    views = [ReplicaView(waiting=2), ReplicaView(running=1), ReplicaView(waiting=1, running=1)]
    assert make_router("least-load", ctx(3)).route(req("a", [1]), views) == 1
    r = make_router("session-hash", ctx(8))
    first = [r.route(req(f"a{i}", [i], session=f"user{i}"), idle(8)) for i in range(40)]
    again = [make_router("session-hash", ctx(8)).route(req(f"b{i}", [7], session=f"user{i}"),
                                                        idle(8)) for i in range(40)]
    assert first == again and len(set(first)) > 4          # stable, and spread
    r3 = make_router("session-hash", ctx(3))
    assert r3.route(req("x", [1]), views) == 1              # no key: the least loaded


def test_sglang_follows_its_tree_until_load_is_imbalanced():
    r = make_router("sglang-cache-aware", ctx(3))
    prefix = list(range(100))
    first = r.route(req("a", prefix + [1000]), idle(3))
    r.on_route(first, req("a", prefix + [1000]))
    assert r.route(req("b", prefix + [2000]), idle(3)) == first
    other = r.route(req("c", [5000] * 50), idle(3))          # no match: the smallest tree
    assert other != first
    # imbalance beyond both thresholds (abs 64, rel 1.5): the least loaded worker
    o = SGLangOptions()
    r.load = [o.balance_abs_threshold + 10, 5, 3]
    r.load[first], r.load[0] = r.load[0], r.load[first]
    least = min(range(3), key=r.load.__getitem__)
    assert r.route(req("d", prefix + [3000]), idle(3)) == least != first
    r.load = [70, 40, 30]                                  # abs 40 < 64: balanced, the tree again
    assert r.route(req("e", prefix + [4000]), idle(3)) == first


def test_ray_prefix_affinity_candidates():
    r = make_router("ray-prefix-affinity", ctx(4))
    prefix = list(range(40))
    r.on_route(2, req("a", prefix + [1]))
    assert r.candidates(req("b", prefix + [2]), idle(4)) == [2]
    assert r.candidates(req("c", [9] * 30), idle(4)) == [0, 1, 3]   # the smallest trees
    skewed = [ReplicaView(waiting=q) for q in (0, 0, 12, 0)]
    assert r.candidates(req("d", prefix + [3]), skewed) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["llm-d-precise", "radixkv"])
def test_event_fed_routers_go_where_the_events_show_the_prefix(name):
    r = make_router(name, ctx(3))
    prefix = list(range(64))
    batch = decode_batch(encode_batch(0.0, to_wire(stored(prefix), PS)))   # over the wire
    r.on_events(1, batch)
    r.on_events(2, stored(list(range(1000, 1064))))                       # as cache events
    assert r.route(req("a", prefix + [7, 8, 9]), idle(3)) == 1
    r.on_events(1, [KVEvent("removed", e.block_hash) for e in stored(prefix)])
    r.on_events(0, stored(prefix))
    assert r.route(req("b", prefix + [7, 8, 9]), idle(3)) == 0


def test_radixkv_counts_an_in_flight_prefix():
    r = make_router("radixkv", ctx(4))
    prefix = list(range(2000))
    a = req("a", prefix + [1])
    first = r.route(a, idle(4))
    r.on_route(first, a)
    r.on_first_token(first, a)                 # prefilled, but no event has arrived yet
    b = req("b", prefix + [2])
    assert r.route(b, idle(4)) == first
    r.on_finish(first, a)                      # finished and no event: nothing is held now
    assert r.inflight[first].count == {} and r.pending == [0] * 4


def test_radixkv_counts_pages_two_requests_fly_until_the_last_one_finishes():
    r = make_router("radixkv", ctx(2))
    shared, own = list(range(4 * PS)), list(range(5000, 5000 + 2 * PS))
    a, b = req("a", shared + own + [1]), req("b", shared + [2] * (3 * PS) + [3])
    r.on_route(0, a)
    r.on_route(0, b)
    ha, hb = r.page_hashes(a), r.page_hashes(b)
    assert ha[:4] == hb[:4] and len(ha) == 6 and len(hb) == 7
    assert r.inflight[0].count == {**dict.fromkeys(ha, 1), **dict.fromkeys(hb, 1), **dict.fromkeys(ha[:4], 2)}
    r.on_finish(0, a)                          # the shared pages still fly with b
    assert r.inflight[0].count == dict.fromkeys(hb, 1)
    r.on_finish(0, b)
    assert r.inflight[0].count == {} and r.flying == [0, 0]


@pytest.mark.parametrize("change", [None, "event", "finish"])
def test_radixkv_on_route_takes_the_hit_route_read_unless_what_it_read_changed(change):
    """on_route takes its replica's hit from route without a second scan, but an event or a
    finished request in between (what the hit reads: held pages, pages in flight) drops it:
    the flight's new tokens are always those of a scan at on_route."""
    r = make_router("radixkv", ctx(2))
    prefix = list(range(8 * PS))
    r.on_events(0, stored(prefix[:4 * PS]))
    other = req("o", prefix + [9])
    r.on_route(1, other)                       # its pages fly on replica 1
    a = req("a", prefix + [1])
    r.route(a, idle(2))
    if change == "event":
        r.on_events(1, stored(prefix + [5] * PS))
    elif change == "finish":
        r.on_finish(1, other)
    scans = []
    held = r.held_pages
    r.held_pages = lambda *args: scans.append(args[0]) or held(*args)
    want = {0: r.hit_tokens(0, r.page_hashes(a), a.prompt_len),
            1: r.hit_tokens(1, r.page_hashes(a), a.prompt_len)}
    scans.clear()
    r.on_route(1, a)
    assert r._flights["a"].new_tokens == a.prompt_len - want[1]
    assert want == {0: 4 * PS, 1: 0 if change == "finish" else 8 * PS}
    assert scans == ([] if change is None else [1])


def test_radixkv_prefers_a_cold_idle_replica_when_the_warm_queue_costs_more():
    r = make_router("radixkv", ctx(2))
    prefix = list(range(256))
    r.on_events(0, stored(prefix))
    q = req("q", prefix + [1])
    assert r.route(q, idle(2)) == 0                        # warm and idle
    r.pending[0] = 100_000                                 # warm, with a long prefill queue
    assert r.route(q, idle(2)) == 1
    pred = r.predict(q, r.page_hashes(q))
    assert pred[0].hit_tokens == 256 and pred[1].hit_tokens == 0
    assert pred[0].wait > pred[1].own


def test_radixkv_decode_weight_weighs_the_batch_a_request_would_join():
    """Off (the default), a warm replica wins whatever its decode batch; with decode_weight,
    a cold idle replica wins once the warm one's batch slows this request's decode by more
    than the prefill it saves."""
    from radixkv.router.radixkv import RadixKVOptions
    prefix = list(range(64))
    q = RequestInfo("q", prefix + [1], max_new_tokens=500)
    busy = [ReplicaView(running=200, kv_capacity=10_000), ReplicaView(kv_capacity=10_000)]
    for weight, expect in ((0.0, 0), (1.0, 1)):
        r = make_router("radixkv", ctx(2), RadixKVOptions(decode_weight=weight))
        r.on_events(0, stored(prefix))
        assert r.route(q, busy) == expect
        assert r.route(q, idle(2)) == 0                 # equal batches: the warm one
    with pytest.raises(ValueError, match="decode_weight"):
        RadixKVOptions(decode_weight=-1)


@pytest.mark.parametrize("name", ["radixkv", "radixkv-fit"])
def test_radixkv_spreads_once_requests_in_flight_would_displace_a_replicas_cached_prefixes(name):
    """A replica's requests in flight hold KV it cannot evict. Past lock_share of its capacity,
    what a placement adds there pushes out cached prefixes: a warm replica that is otherwise
    the best loses to a cold one, exactly when the charge for the displaced tokens outweighs the
    prefix it would have reused; with lock_weight 0 nothing is charged (the fitted rule's own
    prior already counts the running request against the warm replica: no control there)."""
    from dataclasses import replace
    from radixkv.router.radixkv import RadixKVOptions
    prefix = list(range(64))
    views = [ReplicaView(kv_capacity=4_000)] * 2
    base = make_router(name, ctx(2)).options
    assert (base.lock_share, base.lock_weight) == (0.4, 3.0)
    for weight, expect in ((3.0, 1), (0.0, 0))[:2 if name == "radixkv" else 1]:
        r = make_router(name, ctx(2), replace(base, lock_weight=weight))
        r.on_events(0, stored(prefix))
        q = RequestInfo("q", prefix + [1], max_new_tokens=8)
        assert r.route(q, views) == 0                        # nothing in flight: the warm one
        assert r.displaced(0, q, 64, views[0]) == 0
        flying = RequestInfo("f", [7] * 400, max_new_tokens=2_700)   # 100 pages + its budget
        r.on_route(0, flying)
        r.on_first_token(0, flying)                          # decoding: no queue ahead of q
        assert r.locked(0) == 100 * PS + 2_700
        # room under the share: 1,600 - 3,100 < 0, so all of q's 1 + 8 new tokens displace
        assert r.displaced(0, q, 64, views[0]) == 9
        assert r.displaced(1, q, 0, views[1]) == 0           # the cold one has room for 73
        assert r.displaced(0, q, 64, ReplicaView()) == 0     # capacity unknown: no charge
        big = RequestInfo("b", prefix + list(range(100, 1_000)), max_new_tokens=100)
        assert r.route(big, views) == expect
        r.on_finish(0, flying)
        assert r.locked(0) == 0 and r.route(big, views) == 0
    for bad in ({"lock_share": 0}, {"lock_share": 1.5}, {"lock_weight": -1}):
        with pytest.raises(ValueError, match=f"radixkv {next(iter(bad))}"):
            RadixKVOptions(**bad)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        make_router("nope", ctx(2))
    with pytest.raises(ValueError, match="needs a cost model"):
        make_router("radixkv", RouterContext(2))
    with pytest.raises(ValueError, match="num_replicas"):
        RouterContext(0)
    with pytest.raises(ValueError, match="hash_memo must be True or False, got 'no'"):
        RouterContext(2, hash_memo="no")
    with pytest.raises(ValueError, match="2 views"):
        make_router("round-robin", ctx(3)).route(req("a", [1]), idle(2))
    with pytest.raises(ValueError, match="cache_threshold"):
        SGLangOptions(cache_threshold=1.5)


def test_radixkv_spreads_equal_placements_by_the_new_tokens_each_replica_was_sent():
    """Equal costs, equal hits, equal queues: the replica sent the fewest new tokens, not the
    lowest index (which sent every new prefix of an idle fleet to replica 0)."""
    r = make_router("radixkv", ctx(3))
    picks = []
    for i, n in enumerate((800, 200, 100, 50)):
        q = req(f"c{i}", range(10_000 * (i + 1), 10_000 * (i + 1) + n))   # no shared prefix
        picks.append(r.route(q, idle(3)))
        r.on_route(picks[-1], q)
        r.on_first_token(picks[-1], q)         # prefilled: no wait left anywhere
    assert picks == [0, 1, 2, 2] and r.stored == [800, 200, 150]
    busy = [ReplicaView(kv_capacity=10_000)] * 2 + [ReplicaView(kv_capacity=10_000, running=1)]
    assert r.route(req("d", range(90_000, 90_040)), busy) == 1     # the queue comes first
    r.on_events(0, stored(list(range(50_000, 50_064))))
    assert r.route(req("e", list(range(50_000, 50_064)) + [1]), idle(3)) == 0   # then the hit


def test_radixkv_a_busy_fleet_keeps_a_prefix_where_it_is_held():
    import math
    from radixkv.router.radixkv import RadixKVOptions
    r = make_router("radixkv", ctx(2))
    prefix = list(range(256))
    r.on_events(0, stored(prefix))
    q = req("q", prefix + [1], t=100.0)
    r.pending[0] = 1000                        # a prefill queue on the holder
    assert r.route(q, idle(2)) == 1            # an idle fleet: recompute elsewhere, skip it
    assert r.load(100.0, 0.9 * 30 * 2) == pytest.approx(0.9)   # 54 s of prefill just placed
    assert r.route(q, idle(2)) == 0            # a busy one: each recomputed second costs 10
    assert r.load(130.0) == pytest.approx(0.9 * math.exp(-1))   # decays over load_window
    assert r.load(130.0, 1e6) == 0.95          # capped
    fresh = make_router("radixkv", ctx(2))
    fresh.on_route(1, q)                       # what it places counts at the step cost
    assert fresh.load(100.0) == pytest.approx(fresh.prefill_time(0, 257) / 60)
    with pytest.raises(ValueError, match="load_window"):
        RadixKVOptions(load_window=0)


@pytest.mark.parametrize("name", ["radixkv", "radixkv-fit", "llm-d-precise", "dynamo-kv"])
def test_a_request_is_hashed_once_however_often_its_pages_are_asked(name, monkeypatch):
    """route, on_route and the caller (the gateway's prediction) share one hashing of the
    prompt; another request, even with the same tokens, is hashed anew to the same values."""
    import radixkv.router.base as base
    from radixkv.kvevents.hashes import PageHashes, page_hashes
    calls = []
    monkeypatch.setattr(base, "PageHashes",
                        lambda *a, **k: calls.append(1) or PageHashes(*a, **k))
    r = make_router(name, ctx(2))
    a, b = req("a", range(40)), req("b", range(40))
    r.on_route(r.route(a, idle(2)), a)
    ha = r.page_hashes(a)
    assert list(ha) == page_hashes(a.tokens, a.namespace, PS) and len(calls) == 1
    hb = r.page_hashes(b)
    assert list(hb) == list(ha) and hb is not ha and len(calls) == 2
    r.on_route(r.route(b, idle(2)), b)
    assert r.page_hashes(b) is hb and len(calls) == 2
