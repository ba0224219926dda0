"""KV cache events on the wire, in vLLM's format, and a subscriber that rebuilds a cache's pages.

Wire types: msgspec Structs laid out as vLLM's `vllm/distributed/kv_events.py` lays them out
(array-like, tagged): a batch is `[ts, [event, ...], data_parallel_rank]` and an event is
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
`["BlockRemoved", block_hashes, medium]` or `["AllBlocksCleared"]`. `to_wire` turns a cache's
per-page `KVEvent`s into these; `page_hashes` computes the hashes a router computes for a prompt.

`KVIndex` is the subscriber: `apply` is the pure part (which pages a server holds); `connect`
adds a ZMQ SUB socket and a DEALER to the publisher's replay ROUTER. Messages are `[topic,
8-byte big-endian seq, payload]`; on a sequence gap the index sends the 8-byte start seq to the
replay socket, which answers one `[seq, payload]` per buffered batch and ends with seq -1 and an
empty payload.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import zmq

from radixkv.cache.events import KVEvent, chain_hash, check_hash_algo
from radixkv.cache.key import RadixKey
from radixkv.validate import int_at_least, positive_int

MEDIUM_GPU = "GPU"
END_SEQ = -1                        # the replay socket's end-of-stream marker


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the KV cache events (the tag is the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def to_wire(events: Iterable[KVEvent], block_size: int) -> list[WireEvent]:
    """vLLM events for a cache's KV events, in order: a run of "stored" pages that chain (each
    one's parent is the previous one's hash) becomes one BlockStored, a run of "removed" pages
    one BlockRemoved, "cleared" an AllBlocksCleared."""
    block_size = positive_int(block_size, "block_size")
    out: list[WireEvent] = []
    for e in events:
        last = out[-1] if out else None
        if e.kind == "stored":
            if len(e.token_ids) != block_size:
                raise ValueError(f"stored page {e.block_hash} has {len(e.token_ids)} tokens, "
                                 f"not block_size {block_size}")
            if isinstance(last, BlockStored) and last.block_hashes[-1] == e.parent_hash:
                last.block_hashes.append(e.block_hash)
                last.token_ids.extend(e.token_ids)
            else:
                out.append(BlockStored([e.block_hash], e.parent_hash, list(e.token_ids),
                                       block_size, None, MEDIUM_GPU))
        elif e.kind == "removed":
            if isinstance(last, BlockRemoved):
                last.block_hashes.append(e.block_hash)
            else:
                out.append(BlockRemoved([e.block_hash], MEDIUM_GPU))
        elif e.kind == "cleared":
            out.append(AllBlocksCleared())
        else:
            raise ValueError(f"unknown KV event kind {e.kind!r}; valid: stored, removed, cleared")
    return out


def encode_batch(ts: float, events: Sequence[WireEvent], dp_rank: int | None = None) -> bytes:
    """The msgpack payload of one batch."""
    return _encoder.encode(KVEventBatch(float(ts), list(events), dp_rank))


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its msgpack payload; raises ValueError on a malformed one."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise ValueError(f"malformed KV event batch ({len(payload)} bytes): {e}") from None


def page_hashes(tokens, namespace: tuple, page_size: int, algo: str = "sha256", *,
                salt_first_only: bool = False) -> list[int]:
    """The chained hashes of the whole pages of `tokens` under `namespace` (extra_key,
    cache_salt): what a cache emits when it stores them. RadixCache mixes the whole namespace
    into every page; BlockHashCache, as vLLM, mixes cache_salt into the first page only
    (salt_first_only=True). Without a salt both agree."""
    if not isinstance(namespace, tuple) or len(namespace) != 2:
        raise ValueError(f"namespace must be a tuple (extra_key, cache_salt), got {namespace!r}")
    key = RadixKey(tokens, extra_key=namespace[0], cache_salt=namespace[1])
    page_size, algo = positive_int(page_size, "page_size"), check_hash_algo(algo)
    inner = (key.namespace[0], None) if salt_first_only else key.namespace
    out: list[int] = []
    parent = None
    for i in range(len(key) // page_size):
        parent = chain_hash(parent, key.namespace if i == 0 else inner, key.page(i, page_size), algo)
        out.append(parent)
    return out


class KVIndex:
    """Which pages one server holds, rebuilt from its event stream.

    A page is held from a BlockStored to a BlockRemoved of its hash; a hash stored twice (a
    block cache may hold identical content twice) stays held until removed twice.
    """

    def __init__(self) -> None:
        self._held: dict[int, int] = {}             # hash -> copies held
        self.parents: dict[int, int | None] = {}    # hash -> its parent page's hash
        self.last_seq = -1
        self.gaps = 0                # sequence gaps seen
        self.missed = 0              # batches never applied (lost and not replayed)
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
        held = self._held
        for e in batch.events:
            if isinstance(e, BlockStored):
                parent = e.parent_block_hash
                for h in e.block_hashes:
                    held[h] = held.get(h, 0) + 1
                    self.parents[h] = parent
                    parent = h
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    n = held.get(h, 0)
                    if n > 1:
                        held[h] = n - 1
                    elif n == 1:
                        del held[h]
                        self.parents.pop(h, None)
            else:
                held.clear()
                self.parents.clear()
        self.last_seq = seq
        return True

    def hashes(self) -> set[int]:
        return set(self._held)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._held

    def __len__(self) -> int:
        return len(self._held)

    def prefix_match(self, hashes: Sequence[int]) -> int:
        """How many leading `hashes` (a prompt's page hashes) are held: its cached prefix in pages."""
        for i, h in enumerate(hashes):
            if h not in self._held:
                return i
        return len(hashes)

    # ---- the network part -------------------------------------------------------------------
    @classmethod
    def connect(cls, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> KVIndex:
        """An index subscribed to `endpoint` (the publisher's PUB socket) for `topic`, repairing
        gaps through `replay_endpoint` (its ROUTER socket) when given."""
        index = cls()
        ctx = zmq.Context.instance()
        index._sub = ctx.socket(zmq.SUB)
        index._sub.setsockopt(zmq.LINGER, 0)
        index._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
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
        return applied + self._step(seq, decode_batch(payload))

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
        longer holds count as missed."""
        if self._replay is None:
            raise ValueError("catch_up needs a replay endpoint (KVIndex.connect(..., replay_endpoint))")
        timeout_ms = int_at_least(timeout_ms, "timeout_ms")
        self._replay.send_multipart([b"", (self.last_seq + 1).to_bytes(8, "big")])
        applied, ended = 0, False
        while self._replay.poll(timeout_ms):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                ended = True
                break
            if seq > self.last_seq:
                applied += self._step(seq, decode_batch(frames[2]))
        if not ended:                       # a late answer must not end the next replay
            self._open_replay()
        return applied

    def close(self) -> None:
        for s in (self._sub, self._replay):
            if s is not None:
                s.close(linger=0)
        self._sub = self._replay = None

    def __enter__(self) -> KVIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared",
           "KVEventBatch", "MEDIUM_GPU", "to_wire", "encode_batch", "decode_batch",
           "page_hashes", "KVIndex"]
