"""The Ray Serve router adapter when a replica dies and another takes its rank: the newcomer's
pages are kept (a stale listing of the dead one must not clear them on every sync), and the
dead replica's in-flight requests stop counting as load; a replica Ray Serve reports dead is
forgotten at once, before any replacement. No Ray cluster: a fake hub."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("ray.serve")

from radixkv.cache.radix import RadixCache
from radixkv.kvevents.wire import encode_batch, to_wire
from radixkv.rayserve.request_router import RouterAdapter, build_router
from radixkv.router.base import RequestInfo


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    async def remote(self, *args):
        return self.fn(*args)


class _Told:
    def __init__(self, calls: list):
        self.calls = calls

    def remote(self, *args):
        self.calls.append(args)


class FakeHub:
    def __init__(self):
        self.log, self.reps, self.dropped_ids = [], {}, []
        self.dropped = _Told(self.dropped_ids)

    @property
    def pull(self):
        return _Remote(lambda c: {"items": self.log[c:], "next": len(self.log), "lost": 0,
                                  "replicas": dict(self.reps)})


def adapter(hub: FakeHub) -> RouterAdapter:
    ad = object.__new__(RouterAdapter)            # initialize_state without a Ray actor lookup
    ad.setup(build_router({"router": "llm-d-precise", "replicas": 2, "page_size": 4,
                           "hash_algo": "sha256", "seed": 0, "prefill_chunk": 8192,
                           "model": "llama-3-8b", "gpu": "h100-sxm"}), 2, hub)
    return ad


def test_regression_a_replaced_replica_keeps_its_successors_pages():
    hub = FakeHub()
    ad = adapter(hub)
    hub.reps = {"A": {"rank": 0}, "B": {"rank": 1}}
    asyncio.run(ad.sync())
    info = RequestInfo("r1", list(range(40)), max_new_tokens=8)
    ad.inflight.sent(0, info)                     # in flight on A
    hub.reps["C"] = {"rank": 0}                   # A died; C took rank 0; A is still listed
    cache = RadixCache(4, enable_events=True)
    cache.insert(list(range(16)), np.arange(16))
    hub.log.append(("C", "events", encode_batch(0.0, to_wire(cache.events().take(), 4))))
    asyncio.run(ad.sync())
    asyncio.run(ad.sync())                        # used to clear rank 0 again on every sync
    assert ad.ranks == {"B": 1, "C": 0}
    hashes = ad.router.page_hashes(RequestInfo("q", list(range(16))))
    assert ad.router.index.indexes[0].prefix_match(hashes) == 4
    f = ad.inflight
    assert f.held[0] == 0 and f.budget[0] == 0 and f.unprefilled[0] == 0 and "r1" not in f.infos


def stored(tokens: list[int]) -> bytes:
    cache = RadixCache(4, enable_events=True)
    cache.insert(tokens, np.arange(len(tokens)))
    return encode_batch(0.0, to_wire(cache.events().take(), 4))


def test_a_replica_ray_reports_dead_is_forgotten_before_its_replacement_comes():
    hub = FakeHub()
    ad = adapter(hub)
    hub.reps = {"A": {"rank": 0}, "B": {"rank": 1}}
    hub.log += [("A", "events", stored(list(range(16)))), ("B", "events", stored([7] * 8))]
    asyncio.run(ad.sync())
    ad.running({"A", "B"})
    ad.inflight.sent(0, RequestInfo("r1", list(range(40)), max_new_tokens=8))
    assert ad.state()["ranks"][0] == {"rank": 0, "replica": "A", "pages": 4, "in_flight": 1}
    ad.running({"B"})                 # A is gone from Ray's set: it died
    assert ad.state() == {"ranks": [{"rank": 0, "replica": None, "pages": 0, "in_flight": 0},
                                    {"rank": 1, "replica": "B", "pages": 2, "in_flight": 0}],
                          "dead": ["A"]}
    assert hub.dropped_ids == [("A",)] and ad.ranks == {"B": 1}
    hashes = ad.router.page_hashes(RequestInfo("q", list(range(16))))
    assert ad.router.index.indexes[0].prefix_match(hashes) == 0
    hub.log.append(("A", "events", stored(list(range(100, 116)))))    # late, from the dead one
    asyncio.run(ad.sync())                      # the hub lists A still: it stays forgotten
    assert ad.ranks == {"B": 1} and ad.state()["ranks"][0]["pages"] == 0
    hub.reps["D"] = {"rank": 0}                 # the replacement registers...
    hub.log.append(("D", "events", stored(list(range(16)))))
    asyncio.run(ad.sync())
    ad.running({"B"})                           # ...before Ray lists it running: it stays
    assert ad.ranks == {"B": 1, "D": 0} and ad.state()["ranks"][0]["pages"] == 4
    ad.died("A")                                # told twice (Ray's hook too): nothing changes
    assert hub.dropped_ids == [("A",)] and ad.ranks == {"B": 1, "D": 0}
