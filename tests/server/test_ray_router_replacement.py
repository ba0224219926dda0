"""The Ray Serve router adapter when a replica dies and another takes its rank: the newcomer's
pages are kept (a stale listing of the dead one must not clear them on every sync), and the
dead replica's in-flight requests stop counting as load. No Ray cluster: a fake hub."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve")

from radixkv.cache.radix import RadixCache
from radixkv.kvevents.wire import encode_batch, to_wire
from radixkv.rayserve.request_router import RouterAdapter, build_router
from radixkv.router.base import RequestInfo
from radixkv.router.inflight import InFlight


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    async def remote(self, *args):
        return self.fn(*args)


class FakeHub:
    def __init__(self):
        self.log, self.reps = [], {}

    @property
    def pull(self):
        return _Remote(lambda c: {"items": self.log[c:], "next": len(self.log), "lost": 0,
                                  "replicas": dict(self.reps)})


def adapter(hub: FakeHub) -> RouterAdapter:
    ad = object.__new__(RouterAdapter)            # initialize_state without a Ray actor lookup
    ad.router = build_router({"router": "llm-d-precise", "replicas": 2, "page_size": 4,
                              "hash_algo": "sha256", "seed": 0, "prefill_chunk": 8192,
                              "model": "llama-3-8b", "gpu": "h100-sxm"})
    ad.n, ad.hub, ad.cursor, ad.ranks = 2, hub, 0, {}
    ad.figures, ad.inflight, ad.pending = [{}, {}], InFlight(2), {}
    ad.t0, ad.lock = time.monotonic(), asyncio.Lock()
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
    hub.log.append(("C", "events", encode_batch(0.0, to_wire(cache.take_events(), 4))))
    asyncio.run(ad.sync())
    asyncio.run(ad.sync())                        # used to clear rank 0 again on every sync
    assert ad.ranks == {"B": 1, "C": 0}
    hashes = ad.router.page_hashes(RequestInfo("q", list(range(16))))
    assert ad.router.index.indexes[0].prefix_match(hashes) == 4
    f = ad.inflight
    assert f.held[0] == 0 and f.budget[0] == 0 and f.unprefilled[0] == 0 and "r1" not in f.infos
