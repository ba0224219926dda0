"""What the gateway knows a worker holds.

`EventFeed`: the worker's KV events (vLLM's current tagged-map encoding or the older positional
one), read on a thread of its own from its ZMQ PUB socket (connecting to it, or binding the
address where the publisher connects, as vLLM's does to a concrete tcp address), sequence gaps repaired through its
replay socket when given, each batch handed to `sink(batch)` in order. A worker that restarts
(its sequence starts again from 0) is followed from there, its old pages forgotten, and so is a
loss no replay repairs (kvevents/index.py: the index resyncs). `counts()` says how many batches
came, were lost (`missed`), were repaired through replay, and how often it resynced.

`SentFeed`: without events, an approximate index of what the gateway itself sent, as Dynamo's
`--no-kv-events` keeps: every prompt's whole pages count as stored on the worker it went to,
and leave after `ttl` seconds unless sent again.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.wire import (AllBlocksCleared, BlockRemoved, BlockStored, EventBatch,
                                   KVEventBatch)

log = logging.getLogger(__name__)
Sink = Callable[[EventBatch], None]


class FeedCounts(NamedTuple):
    batches: int         # batches handed to the sink (resync clears included)
    gaps: int            # sequence gaps seen on the live stream
    missed: int          # batches lost for good (never applied)
    replayed: int        # batches applied from the replay socket
    resyncs: int         # losses that made the index forget the worker's pages
    caught_up: bool      # the worker's buffered history replayed since subscribing


class _Forwarding(KVIndex):
    """A KVIndex that hands every batch it applies to `sink` (set after `connect`), and a
    resync as an AllBlocksCleared. It keeps the stream's sequence (gaps, losses, replays), not
    its pages: the sink's owner keeps those, so each batch is applied once."""
    sink: Sink | None = None

    def _apply_events(self, batch: EventBatch) -> None:
        if self.sink is not None:
            self.sink(batch)

    def _resync(self) -> None:
        if self.sink is not None:
            self.sink(KVEventBatch(time.time(), [AllBlocksCleared()]))
        super()._resync()


class EventFeed:
    def __init__(self, endpoint: str, replay_endpoint: str | None, sink: Sink, topic: str = "",
                 bind: bool = False):
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic
        self.bind = bind                  # the publisher connects to `endpoint`: bind it
        self.sink = sink
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"kv-events {endpoint}")
        self.batches = 0
        self.caught_up = False
        self._index: KVIndex | None = None
        self._thread.start()

    def counts(self) -> FeedCounts:
        i = self._index
        if i is None:
            return FeedCounts(self.batches, 0, 0, 0, 0, False)
        return FeedCounts(self.batches, i.gaps, i.missed, i.replayed, i.resyncs, self.caught_up)

    def _count(self, batch: EventBatch) -> None:
        self.batches += 1
        self.sink(batch)

    def _run(self) -> None:
        try:
            index = _Forwarding.connect(self.endpoint, self.replay_endpoint, self.topic,
                                        bind=self.bind)
        except ValueError as e:               # the endpoint is taken: no event will come
            log.error("KV events of %s: %s", self.endpoint, e)
            return
        index.sink = self._count
        self._index = index
        try:
            if self.replay_endpoint is not None:
                index.catch_up(1000)                  # what it published before we came
            self.caught_up = True
            while not self._stop.is_set():
                msg = index.receive(100)
                if msg is None:
                    continue
                seq, payload = msg
                if seq < index.last_seq:              # the worker restarted: a new sequence
                    log.info("KV events of %s restarted at seq %d", self.endpoint, seq)
                    self._count(KVEventBatch(time.time(), [AllBlocksCleared()]))
                    index.last_seq = seq - 1
                try:
                    index.handle(seq, payload)
                except ValueError as e:               # a malformed batch: skipped, logged
                    log.warning("KV events of %s: %s", self.endpoint, e)
        finally:
            index.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


class SentFeed:
    def __init__(self, page_size: int, sink: Sink, ttl: float = 120.0,
                 clock: Callable[[], float] = time.monotonic):
        self.page_size, self.sink, self.ttl, self.clock = page_size, sink, ttl, clock
        # page hash -> when it is forgotten; one ttl for all, so the soonest is always first
        self._expiry: OrderedDict[int, float] = OrderedDict()

    def sent(self, tokens, hashes: list[int]) -> None:
        """A prompt of `tokens` went to the worker; `hashes`: its whole pages' chained hashes
        (as the router computed them: kvevents.hashes.page_hashes)."""
        self.expire()
        expiry = self._expiry
        new = [h for h in hashes if h not in expiry]
        until = self.clock() + self.ttl
        for h in hashes:
            expiry[h] = until
            expiry.move_to_end(h)
        if new:
            # the new pages chain from the last page already held (or from nothing)
            first = hashes.index(new[0])
            parent = hashes[first - 1] if first else None
            self.sink(KVEventBatch(time.time(), [BlockStored(
                new, parent, list(tokens[first * self.page_size:len(hashes) * self.page_size]),
                self.page_size, None, "GPU")]))

    def expire(self) -> None:
        now, expiry, gone = self.clock(), self._expiry, []
        while expiry:                                 # the expired pages only, soonest first
            h, t = next(iter(expiry.items()))
            if t > now:
                break
            expiry.popitem(last=False)
            gone.append(h)
        if gone:
            self.sink(KVEventBatch(time.time(), [BlockRemoved(gone, "GPU")]))

    def close(self) -> None:
        self._expiry.clear()
