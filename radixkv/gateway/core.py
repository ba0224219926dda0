"""The gateway's routing state: its workers, one router of `radixkv cluster` (the same objects as
the simulator and Ray Serve) over them, what is in flight on each (router/inflight.py), and
what each holds (feeds.py), behind one lock (the event threads and the HTTP loop both reach it).

A worker out of the rotation keeps its index but is never chosen; its pages are forgotten
(AllBlocksCleared) when it leaves. A change of the fleet (`add`, `remove`) builds the router
afresh over the new list. When the router picks a worker that is out of the rotation, and for a
retry, the next best is the healthy worker with the least work in flight.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

from radixkv.kvevents.hashes import check_route_hash
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.wire import AllBlocksCleared, EventBatch, KVEventBatch
from radixkv.router import ROUTERS, RequestInfo, RouterContext, make_router
from radixkv.router.base import StepCost
from radixkv.router.inflight import InFlight
from radixkv.gateway.feeds import EventFeed, SentFeed
from radixkv.gateway.hash_check import HashCheck
from radixkv.gateway.workers import Worker


class EventSource(NamedTuple):
    endpoint: str
    replay: str | None = None
    bind: bool = False            # the publisher connects to `endpoint` (vLLM's to a tcp host)


class Routing:
    def __init__(self, router: str, *, events: dict[str, EventSource] | None = None,
                 cost: StepCost | None = None, seed: int = 0, prefill_chunk: int = 8192,
                 sent_ttl: float = 120.0, hash_algo: str | None = None, options=None):
        if router not in ROUTERS:
            raise ValueError(f"--router {router!r} is unknown; known: {', '.join(ROUTERS.names())}")
        self.router_name, self.events = router, dict(events or {})
        self.cost, self.seed, self.prefill_chunk = cost, seed, prefill_chunk
        # None: the hashes the workers say their events carry (radixkv's sha256 when none says)
        self.sent_ttl, self.hash_given, self.options = sent_ttl, hash_algo, options
        self.hash_algo = "sha256" if hash_algo is None else check_route_hash(hash_algo)
        self.lock = threading.RLock()
        self.workers: list[Worker] = []
        self.feeds: list = []
        self.checks: list[HashCheck | None] = []
        self.indexes: list[KVIndex] = []          # what each worker holds, for the prediction:
        self._own: list[bool] = []                # the router's index, or the gateway's own
        self.router = None
        self.inflight = InFlight(0)
        self.page_size = 1

    # ---- the fleet ----------------------------------------------------------------------------
    def build(self, workers: list[Worker]) -> None:
        """Route over `workers` from now on (a fresh router: nothing is known of them yet)."""
        with self.lock:
            for f in self.feeds:
                if f is not None:
                    f.close()
            self.workers = list(workers)
            sizes = {w.page_size for w in workers if w.page_size}
            if len(sizes) > 1:
                raise ValueError(f"workers differ in page size ({sorted(sizes)}): a prefix "
                                 f"cached on one is hashed differently on another")
            self.page_size = sizes.pop() if sizes else 1
            self.hash_algo = self._hash_of(workers)
            n = max(len(workers), 1)
            ctx = RouterContext(n, self.page_size, self.hash_algo, self.seed, self.cost,
                                self.prefill_chunk, hash_memo=False)     # the caches are remote
            self.router = make_router(self.router_name, ctx, self.options)
            self.inflight = InFlight(n)
            held = [self.router.held_index(i) for i in range(len(workers))]
            self._own = [ix is None for ix in held]           # the router keeps none: keep one
            self.indexes = [KVIndex() if ix is None else ix for ix in held]
            self._seq = [0] * n
            self.feeds = [self._feed(i, w) for i, w in enumerate(workers)]
            # each worker fed by events: whether its events hold what it is sent
            self.checks = [HashCheck(w.url, f.endpoint) if isinstance(f, EventFeed) else None
                           for w, f in zip(workers, self.feeds)]

    def _hash_of(self, workers: list[Worker]) -> str:
        """The page hashes to look prompts up by: the one given, else the one the workers say."""
        if self.hash_given is not None:
            return self.hash_given
        schemes = {w.hash_scheme for w in workers if w.hash_scheme}
        if len(schemes) > 1:
            raise ValueError(f"workers' KV events carry different hashes ({sorted(schemes)}): "
                             f"a prompt is looked up by one; run a fleet of one kind, or "
                             f"name it with --kv-hash")
        return schemes.pop() if schemes else "sha256"

    def _feed(self, i: int, w: Worker):
        def sink(batch: EventBatch, i=i, feeds_of=self.workers) -> None:
            if feeds_of is self.workers:          # a feed of an older fleet is dropped
                self.on_events(i, batch)
        if w.url in self.events:
            src = self.events[w.url]
            return EventFeed(src.endpoint, src.replay, sink, bind=src.bind)
        return SentFeed(self.page_size, sink, self.sent_ttl)

    def hash_counts(self) -> dict:
        """Each worker fed by KV events: its url -> HashCounts (hash_check.py)."""
        with self.lock:
            return {w.url: c.counts() for w, c in zip(self.workers, self.checks)
                    if c is not None}

    def feed_counts(self) -> dict:
        """Each worker fed by KV events: its url -> its feed's FeedCounts."""
        with self.lock:
            return {w.url: f.counts() for w, f in zip(self.workers, self.feeds)
                    if isinstance(f, EventFeed)}

    def close(self) -> None:
        self.build([])

    def on_events(self, i: int, batch: EventBatch) -> None:
        with self.lock:
            self.router.on_events(i, batch)
            if self._own[i]:
                self._seq[i] += 1
                self.indexes[i].apply(self._seq[i], batch)

    def forget(self, i: int) -> None:
        """Worker i left the rotation: what it held is forgotten."""
        self.on_events(i, KVEventBatch(time.time(), [AllBlocksCleared()]))

    # ---- a request ----------------------------------------------------------------------------
    def choose(self, info: RequestInfo, exclude: frozenset[int] = frozenset()) -> int | None:
        """The worker for `info`, or None when no healthy worker is left."""
        with self.lock:
            views = self.inflight.views([w.figures for w in self.workers])
            healthy = [i for i, w in enumerate(self.workers) if w.healthy]
            # a retry takes another worker; with none left, the one that failed (its pooled
            # connection may have been closed under it)
            ok = [i for i in healthy if i not in exclude] or healthy
            if not ok:
                return None
            if not exclude:                        # a retry takes the next best, as it is
                i = self.router.route(info, views)
                if i in ok:
                    return i
            return min(ok, key=lambda j: (views[j].queue_len, views[j].prefill_tokens, j))

    def place(self, info: RequestInfo, exclude: frozenset[int] = frozenset()
              ) -> tuple[int, Worker, int] | None:
        """Choose the worker for `info` and record the request as sent there, in one step, so
        that a request routed concurrently decides knowing where this one went: (its index, the
        worker, the prompt tokens predicted held there), or None when no healthy worker is
        left."""
        with self.lock:
            i = self.choose(info, exclude)
            return None if i is None else (i, self.workers[i], self.record(i, info))

    def record(self, i: int, info: RequestInfo) -> int:
        """`info` went to worker i (`choose` chose it, with nothing routed in between): the
        prompt tokens predicted held there."""
        with self.lock:
            predicted = self.predicted(i, info)
            self.sent(i, info)
            return predicted

    def predicted(self, i: int, info: RequestInfo) -> int:
        """The prompt tokens worker i holds by what the gateway knows (its events, or what it
        sent), in whole pages."""
        with self.lock:           # the router's hashes: the same page size and hash algorithm
            index, check = self.indexes[i], self.checks[i]
            if check is not None:
                check.check(index, time.monotonic(), self.feeds[i].counts().batches)
            return index.prefix_match(self.router.page_hashes(info)) * self.page_size

    def sent(self, i: int, info: RequestInfo) -> None:
        with self.lock:
            self.router.on_route(i, info)
            self.inflight.sent(i, info)
            feed, check = self.feeds[i], self.checks[i]
            if isinstance(feed, SentFeed):
                feed.sent(info.tokens, self.router.page_hashes(info).all())
            elif check is not None and len(info.tokens) >= self.page_size:
                check.sent(self.router.page_hashes(info)[0], time.monotonic())

    def first_output(self, rid: str, now: float | None = None) -> None:
        """`rid`'s first token came back (at `now`, time.monotonic(): its TTFT is measured from
        the request's arrival; None: a whole response, no TTFT)."""
        with self.lock:
            got = self.inflight.first_output(rid)
            if got is not None:
                if now is not None:
                    self.router.on_ttft(got[0], got[1], max(now - got[1].arrival, 0.0))
                self.router.on_first_token(*got)

    def fit_quality(self):
        """How the fitted TTFT tracks the measured one (None: the router fits nothing)."""
        with self.lock:
            return self.router.fit_quality()

    def finished(self, rid: str) -> None:
        with self.lock:
            got = self.inflight.finished(rid)
            if got is not None:
                self.router.on_finish(*got)
