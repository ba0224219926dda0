"""Dynamo's KV router (router/dynamo.py): the replica each request lands on in hand-worked
states, its books through the hooks, and its logits against a naive reading of the formula
over random sequences of routes, events, first tokens and finishes."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from radixkv.cache.events import KVEvent
from radixkv.kvevents.wire import decode_batch, encode_batch, to_wire
from radixkv.offline.simulate import build_requests
from radixkv.router import ReplicaView, RequestInfo, RouterContext, make_router
from radixkv.offline.cluster.simulator import Cluster, run_cluster
from radixkv.router.dynamo import DynamoOptions, softmax_sample
from tests.offline.cluster.test_cluster import CFG, COST, WL
from tests.router.test_routers import PS, stored

IDLE = ReplicaView(kv_capacity=10_000)


def router(n: int, seed: int = 0, **options):
    return make_router("dynamo-kv", RouterContext(n, page_size=PS, seed=seed),
                       DynamoOptions(**options) if options else None)


def req(rid: str, tokens) -> RequestInfo:
    return RequestInfo(rid, list(tokens))


def test_overlap_wins():
    r = router(3)
    prefix = list(range(64))                                    # 16 blocks
    r.on_events(1, stored(prefix))
    q = req("q", prefix + [7, 8, 9])                            # 67 tokens, 16 whole blocks
    # 1: 3/4 prefill block + 16 new active blocks; 0 and 2: 67/4 + 16
    assert r.logits(q) == [32.75, 16.75, 32.75]
    assert r.route(q, [IDLE] * 3) == 1


def test_load_wins_when_overlap_is_small():
    prompt = list(range(40))                                    # 10 blocks
    busy = req("busy", range(1000, 1032))                       # 8 other blocks, prefilled
    for held, weight, want in ((8, 1.0, 1), (40, 1.0, 0), (40, 0.0, 1)):
        r = router(2, overlap_score_weight=weight)
        r.on_route(0, busy)
        r.on_first_token(0, busy)
        r.on_events(0, stored(prompt[:held]))
        q = req("q", prompt)
        w = weight
        # 0: (40 - held) / 4 prefill + 8 active + 10 new; 1: 10 prefill + 10 new
        assert r.logits(q) == [w * (40 - held) / 4 + 18, w * 10 + 10]
        assert r.route(q, [IDLE] * 2) == want


def test_pending_prefill_and_shared_active_blocks_are_counted():
    r = router(2)
    a = req("a", range(40))                                     # 10 blocks
    r.on_route(0, a)                                            # no event, no first token
    assert r.pending == [40, 0]
    b = req("b", list(range(36)) + [99, 98, 97, 96])            # a's first 9 blocks + 1
    # 0: (40 new + 40 pending) / 4 + 10 active + 1 new block (9 shared with a); 1: 10 + 10
    assert r.logits(b) == [31.0, 20.0]
    assert r.route(b, [IDLE] * 2) == 1
    r.on_first_token(0, a)                                      # a's prefill done
    assert r.pending == [0, 0]
    assert r.logits(b) == [21.0, 20.0]
    assert r.route(b, [IDLE] * 2) == 1
    r.on_events(0, stored(list(range(40))))                     # a's blocks now cached on 0
    assert r.logits(b) == [1.0 + 11, 20.0]
    assert r.route(b, [IDLE] * 2) == 0


def test_finish_releases_load():
    r = router(2)
    a, b = req("a", range(40)), req("b", range(100, 140))
    r.on_route(0, a)
    r.on_route(0, b)
    r.on_first_token(0, a)
    assert r.pending == [40, 0] and len(r.active[0]) == 20
    q = req("q", range(200, 240))
    assert r.route(q, [IDLE] * 2) == 1                          # 0 costs 20 + 30, 1 costs 20
    r.on_finish(0, a)
    r.on_finish(0, b)                                           # no first token: still cleared
    assert r.pending == [0, 0] and r.active == [{}, {}] and not r._flights
    assert r.logits(q) == [20.0, 20.0]
    r.on_finish(0, req("never", [1]))                           # unknown: ignored, as Dynamo does
    with pytest.raises(ValueError, match="already routed"):
        r.on_route(1, q)
        r.on_route(1, q)


def test_ties_go_to_a_seeded_uniform_draw_among_the_tied():
    seed = 11
    r = router(4, seed=seed)
    draws = random.Random(seed)
    want = [draws.choice([0, 1, 2, 3]) for _ in range(12)]
    assert [r.route(req(f"r{i}", [5] * 9), [IDLE] * 4) for i in range(12)] == want
    # two of three tied: a draw between those two; a single best consumes no draw
    r = router(3, seed=seed)
    r.on_route(1, req("load", range(8)))
    r.on_first_token(1, req("load", range(8)))
    draws = random.Random(seed)
    assert r.route(req("x", [5] * 8), [IDLE] * 3) == draws.choice([0, 2])
    r.on_events(2, stored([6] * 8))
    assert r.route(req("y", [6] * 8), [IDLE] * 3) == 2
    assert r.route(req("z", [5] * 8), [IDLE] * 3) == draws.choice([0, 2])


def test_temperature_samples_the_softmax_of_the_negated_logits():
    p0 = 1 / (1 + math.exp(-1))                                 # logits [0, 1], T = 1
    assert softmax_sample([0.0, 1.0], 1.0, p0 - 1e-9) == 0
    assert softmax_sample([0.0, 1.0], 1.0, p0 + 1e-9) == 1
    assert softmax_sample([3.0, 3.0, 3.0], 0.5, 0.5) == 1       # equal logits: uniform
    r = router(3, seed=4, router_temperature=0.7)
    r.on_events(1, stored(range(64)))
    draws = random.Random(4)
    for i in range(10):
        q = req(f"q{i}", range(64))
        assert r.route(q, [IDLE] * 3) == softmax_sample(r.logits(q), 0.7, draws.random())


def test_wire_batches_and_cache_events_feed_the_same_index():
    r = router(2)
    prefix = list(range(32))
    r.on_events(1, decode_batch(encode_batch(0.0, to_wire(stored(prefix), PS))))
    assert r.route(req("a", prefix + [1]), [IDLE] * 2) == 1
    r.on_events(1, [KVEvent("removed", e.block_hash) for e in stored(prefix)])
    r.on_events(0, stored(prefix))
    assert r.route(req("b", prefix + [1]), [IDLE] * 2) == 0


@pytest.mark.parametrize("options, match", [
    (dict(overlap_score_weight=-1), "overlap_score_weight .* got -1"),
    (dict(overlap_score_weight=math.inf), "overlap_score_weight .* got inf"),
    (dict(router_temperature=-0.5), "router_temperature .* got -0.5"),
    (dict(router_temperature=math.nan), "router_temperature .* got nan"),
    (dict(router_temperature=True), "router_temperature .* got True"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        DynamoOptions(**options)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="takes DynamoOptions, got dict"):
        make_router("dynamo-kv", RouterContext(2), {"overlap_score_weight": 2})
    with pytest.raises(ValueError, match=r"replica must be an int in \[0, 2\), got 5"):
        router(2).on_route(5, req("a", [1]))


def test_a_cluster_run_is_reproducible_and_leaves_the_books_empty():
    cluster = Cluster(CFG, make_router("dynamo-kv", CFG.context(COST)), COST)
    cluster.run([(q, None) for q in build_requests(WL)])
    cluster.check()
    rt = cluster.router
    assert rt.pending == [0] * 3 and rt.active == [{}] * 3 and not rt._flights
    a, b = (run_cluster(WL, CFG, "dynamo-kv", COST) for _ in range(2))
    assert a == b
    assert a.hit_rate > run_cluster(WL, CFG, "round-robin", COST).hit_rate


# ---- against a naive reference ---------------------------------------------------------------
class Reference:
    """The formula read literally, recomputed from scratch at every route."""

    def __init__(self, n: int, weight: float, seed: int):
        self.n, self.weight, self.rng = n, weight, random.Random(seed)
        self.held = [Counter() for _ in range(n)]             # hash -> copies stored
        self.flights: dict[str, tuple[int, list[int], int, bool]] = {}   # rid -> (r, hashes,
        #                                                       prefill tokens, prefilling)

    @staticmethod
    def hashes(tokens) -> list[int]:
        return [e.block_hash for e in stored(tokens)]

    def overlap(self, r: int, hashes) -> int:
        k = 0
        while k < len(hashes) and self.held[r][hashes[k]] > 0:
            k += 1
        return k

    def logits(self, tokens) -> list[float]:
        hashes, out = self.hashes(tokens), []
        for r in range(self.n):
            new = len(tokens) - PS * self.overlap(r, hashes)
            pending = sum(f[2] for f in self.flights.values() if f[0] == r and f[3])
            active = set().union(*[f[1] for f in self.flights.values() if f[0] == r])
            out.append(self.weight * ((new + pending) / PS) + len(active | set(hashes)))
        return out

    def route(self, tokens) -> int:
        logits = self.logits(tokens)
        tied = [r for r, v in enumerate(logits) if v == min(logits)]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def routed(self, r: int, rid: str, tokens) -> None:
        hashes = self.hashes(tokens)
        self.flights[rid] = (r, hashes, len(tokens) - PS * self.overlap(r, hashes), True)


prompts = st.lists(st.integers(0, 2), min_size=1, max_size=24)
ops = st.lists(st.one_of(
    st.tuples(st.just("route"), prompts),
    st.tuples(st.just("store"), st.integers(0, 2), prompts),
    st.tuples(st.just("remove"), st.integers(0, 2), prompts),
    st.tuples(st.just("first"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50))), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.integers(0, 3))
def test_matches_the_naive_reference(steps, weight, seed):
    r, ref = router(3, seed=seed, overlap_score_weight=weight), Reference(3, weight, seed)
    routed: list[RequestInfo] = []
    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "route":
            q = req(f"q{i}", step[1])
            assert r.logits(q) == pytest.approx(ref.logits(step[1]))
            to = r.route(q, [IDLE] * 3)
            assert to == ref.route(step[1])
            r.on_route(to, q)
            ref.routed(to, q.rid, step[1])
            routed.append(q)
        elif kind in ("store", "remove"):
            events = stored(step[2])
            if kind == "remove":
                events = [KVEvent("removed", e.block_hash) for e in events]
            r.on_events(step[1], events)
            held = ref.held[step[1]]
            for e in events:
                held[e.block_hash] += 1 if kind == "store" else -(held[e.block_hash] > 0)
        elif routed:
            q = routed[step[1] % len(routed)]
            f = ref.flights.get(q.rid)
            if kind == "first":
                r.on_first_token(0 if f is None else f[0], q)
                if f is not None:
                    ref.flights[q.rid] = f[:3] + (False,)
            else:
                r.on_finish(0 if f is None else f[0], q)
                ref.flights.pop(q.rid, None)
    for x in range(3):
        left = [f for f in ref.flights.values() if f[0] == x]
        assert r.pending[x] == sum(f[2] for f in left if f[3])
        assert set(r.active[x]) == set().union(*[f[1] for f in left])
