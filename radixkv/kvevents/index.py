"""`KVIndex`, the KV-event subscriber: which pages each server holds, rebuilt from its events.

`apply` is the pure part; `connect` adds a ZMQ SUB socket and a DEALER to the publisher's replay
ROUTER. Messages are `[topic, 8-byte big-endian seq, payload]`; on a sequence gap the index
sends the 8-byte start seq to the replay socket, which answers one `[seq, payload]` per buffered
batch and ends with seq -1 and an empty payload (vLLM 0.33's publisher puts the topic before
the seq: `[topic, seq, payload]`; both are read).

A loss no replay can repair (the publisher dropped the batch, or its replay buffer no longer
holds it, or there is no replay socket) makes the index resync: it forgets every page, then
applies what follows. From then on every page it holds is one the server holds (a subset: pages
stored before the loss and still held are unknown until stored again), where keeping the old
pages would leave removed ones held.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import compress, count, groupby, repeat
from operator import is_not, itemgetter, not_

import zmq

from radixkv.cache.events import EventRun, KVEvent
from radixkv.kvevents.wire import (END_SEQ, AllBlocksCleared, BlockRemoved, BlockStored, EventBatch,
                                   decode_batch)
from radixkv.argcheck import int_at_least


# a KVEvent's fields by position: (kind, block_hash, parent_hash, token_ids, namespace)
_kind, _hash, _parent, _tokens = itemgetter(0), itemgetter(1), itemgetter(2), itemgetter(3)


def _check_pages(events: Sequence[KVEvent], page_size: int) -> None:
    shapes = set(zip(map(_kind, events), map(len, map(_tokens, events))))
    if shapes <= {("stored", page_size), ("removed", 0), ("cleared", 0)} \
            and set(map(type, events)) <= {KVEvent}:
        return
    for e in events:                              # name the first bad event, if one is
        if type(e) is EventRun:
            raise ValueError("a batch of KVEvents holds an EventRun: give one kind or the other")
        if e.kind == "stored":
            if len(e.token_ids) != page_size:
                raise ValueError(f"stored page {e.block_hash} has {len(e.token_ids)} tokens, "
                                 f"not block_size {page_size}")
        elif e.kind not in ("removed", "cleared"):
            raise ValueError(f"unknown KV event kind {e.kind!r}; valid: stored, removed, cleared")


def _check_runs(runs: Sequence[EventRun], page_size: int) -> None:
    for r in runs:
        if type(r) is not EventRun:
            raise ValueError(f"a batch of EventRuns holds {type(r).__name__} {r!r}: give one "
                             f"kind or the other")
        if r.kind == "stored":
            if not r.whole_pages(page_size):
                raise ValueError(f"stored run of {len(r.hashes)} pages has "
                                 f"{r.num_tokens()} tokens, not block_size "
                                 f"{page_size} a page")
        elif r.kind not in ("removed", "cleared"):
            raise ValueError(f"unknown KV event kind {r.kind!r}; valid: stored, removed, cleared")


class KVIndex:
    """Which pages one server holds, rebuilt from its event stream.

    A page is held from a BlockStored to a BlockRemoved of its hash; a hash stored twice (a
    block cache may hold identical content twice) stays held until removed twice.
    """

    def __init__(self, parents: bool = True) -> None:
        self._held: dict[int, int] = {}             # hash -> copies held
        self.parents: dict[int, int | None] = {}    # hash -> its parent page's hash (kept
        self._parents = parents                     # unless parents=False: a router's index)
        self.last_seq = -1
        self.gaps = 0                # sequence gaps seen
        self.missed = 0              # batches never applied (lost and not replayed)
        self.replayed = 0            # batches applied from the replay socket
        self.resyncs = 0             # losses that made the connected index forget its pages
        self._sub: zmq.Socket | None = None
        self._replay: zmq.Socket | None = None
        self._replay_endpoint: str | None = None
        self.replay_timeout_ms = 1000    # how long a gap's replay waits for each answer

    # ---- the pure part ----------------------------------------------------------------------
    def apply(self, seq: int, batch: EventBatch) -> bool:
        """Apply batch `seq`; False (and nothing changes) when it is not newer than last_seq.
        A jump past last_seq + 1 counts a gap, and the batches skipped as missed."""
        seq = int_at_least(seq, "seq")
        if seq <= self.last_seq:
            return False
        self.gaps += seq > self.last_seq + 1
        return self._step(seq, batch)

    def _step(self, seq: int, batch: EventBatch) -> bool:
        self.missed += seq - self.last_seq - 1
        self._apply_events(batch)
        self.last_seq = seq
        return True

    def _apply_events(self, batch: EventBatch) -> None:
        for e in batch.events:
            if isinstance(e, BlockStored):
                hashes = list(e.block_hashes)
                self._stored(hashes, [e.parent_block_hash, *hashes])
            elif isinstance(e, BlockRemoved):
                self._removed(list(e.block_hashes))
            else:
                self._held.clear()
                self.parents.clear()

    def apply_kv(self, seq: int, events: Sequence[KVEvent] | Sequence[EventRun],
                 page_size: int) -> bool:
        """apply(seq, the wire batch of a cache's KV events) without building it: to_wire only
        merges chained pages into runs, which changes no page held, parent or count. The events
        are KVEvents, or EventRuns as a cache's EventLog records them (events().take_runs()).
        Bad events raise as to_wire does, before anything changes."""
        seq = int_at_least(seq, "seq")
        runs = bool(events) and type(events[0]) is EventRun
        if runs:
            _check_runs(events, page_size)
        else:
            _check_pages(events, page_size)
        if seq <= self.last_seq:
            return False
        self.gaps += seq > self.last_seq + 1
        self.missed += seq - self.last_seq - 1
        if runs:
            for r in events:
                if r.kind == "stored":
                    self._stored(r.hashes, [r.parent, *r.hashes])
                elif r.kind == "removed":
                    self._removed(r.hashes)
                else:
                    self._held.clear()
                    self.parents.clear()
        else:
            for kind, run in groupby(events, _kind):  # runs of one kind, each at C speed
                run = list(run)
                if kind == "stored":
                    self._stored(list(map(_hash, run)), map(_parent, run))
                elif kind == "removed":
                    self._removed(list(map(_hash, run)))
                else:
                    self._held.clear()
                    self.parents.clear()
        self.last_seq = seq
        return True

    def _stored(self, hashes: list[int], parents: Iterable[int | None]) -> None:
        held = self._held
        if held.keys().isdisjoint(hashes) and len(set(hashes)) == len(hashes):
            held.update(dict.fromkeys(hashes, 1))     # new pages, each once: counts of 1
            if self._parents:
                self.parents.update(zip(hashes, parents))
            return
        for h, parent in zip(hashes, parents):
            held[h] = held.get(h, 0) + 1
            if self._parents:
                self.parents[h] = parent

    def _removed(self, hashes: list[int]) -> None:
        held, parents = self._held, self.parents
        counts = list(map(held.pop, hashes, repeat(None)))
        if counts.count(1) == len(hashes):        # pages held once, each removed once: done
            if self._parents:
                deque(map(parents.pop, hashes, repeat(None)), 0)
            return
        # else put back what was taken (a page listed twice was taken once) and count down
        held.update(compress(zip(hashes, counts), map(is_not, counts, repeat(None))))
        for h in hashes:
            n = held.get(h, 0)
            if n > 1:
                held[h] = n - 1
            elif n == 1:
                del held[h]
                parents.pop(h, None)

    @property
    def held_map(self) -> dict[int, int]:
        """hash -> copies held (read-only: for membership tests at C speed)."""
        return self._held

    def hashes(self) -> set[int]:
        return set(self._held)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._held

    def __len__(self) -> int:
        return len(self._held)

    def prefix_match(self, hashes: Sequence[int]) -> int:
        """How many leading `hashes` (a prompt's page hashes) are held: its cached prefix in pages."""
        missing = map(not_, map(self._held.__contains__, hashes))
        return next(compress(count(), missing), len(hashes))

    # ---- the network part -------------------------------------------------------------------
    @classmethod
    def connect(cls, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                bind: bool = False) -> KVIndex:
        """An index subscribed to `endpoint` (the publisher's PUB socket) for `topic`, repairing
        gaps through `replay_endpoint` (its ROUTER socket) when given. `bind`: the publisher
        connects to `endpoint` (as vLLM's does to a concrete tcp address), so bind it here;
        ValueError naming it when it cannot be bound."""
        index = cls()
        ctx = zmq.Context.instance()
        index._sub = ctx.socket(zmq.SUB)
        index._sub.setsockopt(zmq.LINGER, 0)
        index._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        if bind:
            try:
                index._sub.bind(endpoint)
            except zmq.ZMQError as e:
                index._sub.close(linger=0)
                raise ValueError(f"cannot bind the KV events endpoint {endpoint!r} the "
                                 f"publisher connects to: {e}") from None
        else:
            index._sub.connect(endpoint)
        index._replay_endpoint = replay_endpoint
        if replay_endpoint is not None:
            index._open_replay()
        return index

    def _open_replay(self) -> None:
        if self._replay is not None:
            self._replay.close(linger=0)
        self._replay = zmq.Context.instance().socket(zmq.DEALER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self._replay.connect(self._replay_endpoint)

    def receive(self, timeout_ms: int = 0) -> tuple[int, bytes] | None:
        """The next live message as (seq, payload), without applying it; None if none came
        within `timeout_ms`."""
        if self._sub is None:
            raise ValueError("receive needs a connected index (KVIndex.connect)")
        while self._sub.poll(int_at_least(timeout_ms, "timeout_ms")):
            frames = self._sub.recv_multipart()
            if len(frames) == 3 and len(frames[1]) == 8:
                return int.from_bytes(frames[1], "big"), frames[2]
            timeout_ms = 0                  # skip a malformed message, wait no longer
        return None

    def handle(self, seq: int, payload: bytes) -> int:
        """Apply one live message, first replaying what a gap before it lost; returns the
        batches applied (0 for a message already applied)."""
        if seq <= self.last_seq:
            return 0
        applied = 0
        if seq > self.last_seq + 1:
            self.gaps += 1
            if self._replay is not None:
                applied = self.catch_up(self.replay_timeout_ms)
            if seq <= self.last_seq:        # the replay brought it too
                return applied
        batch = decode_batch(payload)
        if seq > self.last_seq + 1:         # still a gap: lost for good
            self._resync()
        return applied + self._step(seq, batch)

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply every live message waiting (waiting up to `timeout_ms` for the first);
        returns the batches applied, replayed ones included."""
        applied = 0
        msg = self.receive(timeout_ms)
        while msg is not None:
            applied += self.handle(*msg)
            msg = self.receive(0)
        return applied

    def catch_up(self, timeout_ms: int = 1000) -> int:
        """Ask the replay socket for every buffered batch after last_seq (a new index starts
        at seq 0) and apply them in order; returns the batches applied. Batches the buffer no
        longer holds count as missed, and make the index resync. What precedes the last
        AllBlocksCleared of the answer is superseded by it: those batches count as applied
        (and replayed) without being applied one by one — a gateway started beside workers
        whose caches were reset skips the history the reset wiped."""
        if self._replay is None:
            raise ValueError("catch_up needs a replay endpoint (KVIndex.connect(..., replay_endpoint))")
        timeout_ms = int_at_least(timeout_ms, "timeout_ms")
        self._replay.send_multipart([b"", (self.last_seq + 1).to_bytes(8, "big")])
        got: list[tuple[int, EventBatch]] = []
        ended, last = False, self.last_seq
        while self._replay.poll(timeout_ms):
            frames = self._replay.recv_multipart()
            if len(frames) == 4:            # vLLM's [empty, topic, seq, payload]
                frames = [frames[0], *frames[2:]]
            if len(frames) != 3 or len(frames[1]) != 8:
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                ended = True
                break
            if seq > last:
                got.append((seq, decode_batch(frames[2])))
                last = seq
        if not ended:                       # a late answer must not end the next replay
            self._open_replay()
        start = next((i for i in range(len(got) - 1, 0, -1)
                      if any(isinstance(e, AllBlocksCleared) for e in got[i][1].events)), 0)
        if start:                           # superseded by the clear: as if applied
            self.replayed += start
            self.last_seq = got[start][0] - 1
        for seq, batch in got[start:]:
            if seq > self.last_seq + 1:
                self._resync()
            self.replayed += self._step(seq, batch)
        return len(got)

    def _resync(self) -> None:
        """A loss no replay repairs: forget every page (what follows is applied after)."""
        self.resyncs += 1
        self._held.clear()
        self.parents.clear()

    def close(self) -> None:
        for s in (self._sub, self._replay):
            if s is not None:
                s.close(linger=0)
        self._sub = self._replay = None

    def __enter__(self) -> KVIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
