"""KV cache events on the wire, in vLLM's format, in both of its encodings.

A batch is positional in both: `[ts, [event, ...], data_parallel_rank]`. The events are
- "map" (the default: vLLM 0.33's `vllm/distributed/kv_events.py`): tagged maps, the required
  fields in vLLM's order and the optional ones omitted: `{"type": "BlockStored", "block_hashes",
  "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}`,
  `{"type": "BlockRemoved", "block_hashes", "medium"}`, `{"type": "AllBlocksCleared"}`;
- "array" (older vLLM releases, and the consumers that read them): positional, tagged:
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
  `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`.
The structs below are the events as radixkv holds them (their own layout is the array one);
`decode_batch` reads either encoding. `to_wire` turns a cache's per-page `KVEvent`s into these
(kvevents/hashes.py computes the hashes a router computes for a prompt).
Messages are `[topic, 8-byte big-endian seq, payload]` (kvevents/publisher.py sends them,
kvevents/index.py reads them).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from radixkv.cache.events import KVEvent
from radixkv.argcheck import positive_int

MEDIUM_GPU = "GPU"
END_SEQ = -1                        # the replay socket's end-of-stream marker
ENCODINGS = ("map", "array")        # vLLM's current event encoding first (the default)


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


# ---- the map encoding: vLLM 0.33's event structs (block hashes may be bytes there) ----------
class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class _MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None


class _MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _MapBatch(EventBatch):
    events: list[_MapStored | _MapRemoved | _MapCleared]


def _to_map(e: WireEvent) -> _MapEvent:
    if isinstance(e, BlockStored):
        return _MapStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size,
                          e.lora_id, e.medium, None)
    if isinstance(e, BlockRemoved):
        return _MapRemoved(e.block_hashes, e.medium)
    return _MapCleared()


def _from_map(e: _MapEvent) -> WireEvent:
    if isinstance(e, _MapStored):
        return BlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size,
                           e.lora_id, e.medium)
    if isinstance(e, _MapRemoved):
        return BlockRemoved(e.block_hashes, e.medium)
    return AllBlocksCleared()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_map_decoder = msgspec.msgpack.Decoder(_MapBatch)


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


def check_encoding(encoding: str) -> str:
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown KV event encoding {encoding!r}; valid: {', '.join(ENCODINGS)}")
    return encoding


def encode_batch(ts: float, events: Sequence[WireEvent], dp_rank: int | None = None,
                 encoding: str = "map") -> bytes:
    """The msgpack payload of one batch, its events in `encoding` ("map": vLLM's current
    tagged maps; "array": the older positional events)."""
    if check_encoding(encoding) == "array":
        return _encoder.encode(KVEventBatch(float(ts), list(events), dp_rank))
    return _encoder.encode(_MapBatch(float(ts), [_to_map(e) for e in events], dp_rank))


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its msgpack payload, in either encoding; raises ValueError on a malformed
    one (an event neither vLLM's current map nor the older array, or a batch mixing them)."""
    try:
        b = _map_decoder.decode(payload)
        return KVEventBatch(b.ts, [_from_map(e) for e in b.events], b.data_parallel_rank)
    except msgspec.DecodeError:
        pass
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise ValueError(f"malformed KV event batch ({len(payload)} bytes): {e}") from None
