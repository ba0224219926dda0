"""KV events on the wire: vLLM's positional msgpack layout, merging a cache's page events into
vLLM events, the page hashes a router computes, and KVIndex's pure part (no sockets)."""
from __future__ import annotations

import msgspec
from hypothesis import given, settings, strategies as st
import numpy as np
import pytest

from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.events import KVEvent, chain_hash
from radixkv.cache.nocache import NoCache
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.kvevents.hashes import page_hashes
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.wire import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch,
                                   decode_batch, encode_batch, to_wire)

from tests.cache._helpers import key, toks


def raw(payload: bytes):
    return msgspec.msgpack.decode(payload)


def stored(h, parent, tokens):
    return KVEvent("stored", h, parent, tuple(tokens))


def test_batch_layout_is_vllms_older_positional_layout():
    events = [BlockStored([11, 12], None, toks(0, 8), 4, None, "GPU"),
              BlockRemoved([12], "GPU"), AllBlocksCleared()]
    payload = encode_batch(1.5, events, 0, encoding="array")
    assert raw(payload) == [1.5, [["BlockStored", [11, 12], None, toks(0, 8), 4, None, "GPU"],
                                  ["BlockRemoved", [12], "GPU"], ["AllBlocksCleared"]], 0]
    assert raw(encode_batch(2.0, [], None)) == [2.0, [], None]  # array-like: every field is sent
    batch = decode_batch(payload)
    assert isinstance(batch, KVEventBatch)
    assert (batch.ts, batch.events, batch.data_parallel_rank) == (1.5, events, 0)
    big = 2**64 - 1                                             # hashes are unsigned 64-bit
    assert decode_batch(encode_batch(0.0, [BlockRemoved([big], "GPU")])).events[0].block_hashes == [big]


def test_decode_rejects_a_malformed_payload():
    with pytest.raises(ValueError, match="malformed KV event batch"):
        decode_batch(msgspec.msgpack.encode([1.0, [["BlockGone", [1]]]]))


def test_to_wire_merges_chained_stored_runs_and_removed_runs():
    events = [stored(1, None, [0, 1]), stored(2, 1, [2, 3]), stored(3, 2, [4, 5]),
              stored(7, 1, [8, 9]),                   # a new branch: its parent is not 3
              KVEvent("removed", 3), KVEvent("removed", 2),
              stored(9, None, [5, 5]),
              KVEvent("removed", 9), KVEvent("cleared"), KVEvent("cleared")]
    wire = to_wire(events, 2)
    assert [raw(msgspec.msgpack.encode(e)) for e in wire] == [
        ["BlockStored", [1, 2, 3], None, [0, 1, 2, 3, 4, 5], 2, None, "GPU"],
        ["BlockStored", [7], 1, [8, 9], 2, None, "GPU"],
        ["BlockRemoved", [3, 2], "GPU"],
        ["BlockStored", [9], None, [5, 5], 2, None, "GPU"],
        ["BlockRemoved", [9], "GPU"],
        ["AllBlocksCleared"], ["AllBlocksCleared"]]
    assert to_wire([], 2) == []


def test_to_wire_rejects_a_page_of_another_size_and_an_unknown_kind():
    with pytest.raises(ValueError, match="has 3 tokens, not block_size 2"):
        to_wire([stored(1, None, [0, 1, 2])], 2)
    with pytest.raises(ValueError, match="unknown KV event kind 'moved'"):
        to_wire([KVEvent("moved", 1)], 2)       # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        to_wire([], 0)


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_page_hashes_equal_what_the_caches_emit(algo):
    T = toks(100, 14)                                    # 3 whole pages of 4 and a partial one
    radix = RadixCache(page_size=4, enable_events=True, hash_algo=algo)
    block = BlockHashCache(block_size=4, enable_events=True, hash_algo=algo)
    radix.insert(key(T), np.arange(14))
    block.insert(key(T[:12]), np.arange(12))
    want = page_hashes(T, (None, None), 4, algo)
    assert len(want) == 3
    assert [e.block_hash for e in radix.events().take()] == want
    assert [e.block_hash for e in block.events().take()] == want
    assert radix.events().page_hashes() == block.events().page_hashes() == set(want)
    assert want[0] == chain_hash(None, (None, None), key(T).page(0, 4), algo)


def test_page_hashes_differ_across_namespaces_and_follow_each_caches_salt_rule():
    T = toks(0, 8)
    plain = page_hashes(T, (None, None), 4)
    salted = page_hashes(T, (None, "tenant-a"), 4)
    lora = page_hashes(T, ("lora-1", None), 4)
    assert len({*plain, *salted, *lora}) == 6
    radix = RadixCache(page_size=4, enable_events=True)
    radix.insert(key(T, (None, "tenant-a")), np.arange(8))
    assert [e.block_hash for e in radix.events().take()] == salted      # the salt in every page
    block = BlockHashCache(block_size=4, enable_events=True)
    block.insert(key(T, (None, "tenant-a")), np.arange(8))
    first_only = page_hashes(T, (None, "tenant-a"), 4, salt_first_only=True)
    assert [e.block_hash for e in block.events().take()] == first_only  # vLLM: first block only
    assert first_only[0] == salted[0] and first_only[1] != salted[1]
    assert page_hashes(T, ("lora-1", None), 4, salt_first_only=True) == lora
    assert page_hashes(toks(0, 3), (None, None), 4) == []
    with pytest.raises(ValueError, match="namespace must be a tuple"):
        page_hashes(T, "tenant-a", 4)
    with pytest.raises(ValueError, match="unknown hash 'md5'"):
        page_hashes(T, (None, None), 4, "md5")


def test_page_hashes_capability_needs_events():
    """No event log without events on, and none for the control: the accessor says None."""
    assert RadixCache(page_size=4).events() is None
    assert BlockHashCache(block_size=4).events() is None
    assert NoCache(page_size=4).events() is None
    for c in (RadixCache(page_size=4, enable_events=True),
              BlockHashCache(block_size=4, enable_events=True)):
        assert c.events().page_hashes() == set() and c.events().take() == []


def test_blockhash_page_hashes_track_duplicates_and_evictions():
    c, pool = BlockHashCache(block_size=4, enable_events=True), SlotPool(64, page_size=4)
    P = toks(0, 8)
    h = page_hashes(P, (None, None), 4)
    c.insert(key(P), pool.alloc(8))
    c.insert(key(P), pool.alloc(8))                      # identical content cached twice
    index = KVIndex()
    index.apply(0, decode_batch(encode_batch(0.0, to_wire(c.events().take(), 4))))
    assert c.free_queue_ids() == [1, 0, 3, 2]
    pool.free(c.evict(4))                                # block 1: one copy of page 2 goes
    index.apply(1, KVEventBatch(0.0, to_wire(c.events().take(), 4)))
    assert c.events().page_hashes() == index.hashes() == set(h)  # the other copy still holds it
    pool.free(c.evict(8))                                # blocks 0 and 3
    index.apply(2, KVEventBatch(0.0, to_wire(c.events().take(), 4)))
    assert c.events().page_hashes() == index.hashes() == {h[0]}


def test_index_applies_stored_removed_and_cleared():
    index = KVIndex()
    assert (len(index), index.last_seq, index.gaps, index.missed) == (0, -1, 0, 0)
    assert index.apply(0, KVEventBatch(1.0, [BlockStored([1, 2, 3], None, toks(0, 6), 2, None, "GPU"),
                                             BlockStored([4], 1, [9, 9], 2, None, "GPU")]))
    assert index.hashes() == {1, 2, 3, 4} and len(index) == 4 and 2 in index and 5 not in index
    assert index.parents == {1: None, 2: 1, 3: 2, 4: 1}
    assert index.prefix_match([1, 2, 3, 8]) == 3
    assert index.prefix_match([1, 4]) == 2
    assert index.prefix_match([2, 3]) == 2            # held hashes chain from their parents
    assert index.prefix_match([8, 1]) == 0 and index.prefix_match([]) == 0
    assert index.apply(1, KVEventBatch(2.0, [BlockRemoved([3, 2, 77], "GPU")]))   # 77: unknown
    assert index.hashes() == {1, 4} and index.prefix_match([1, 2, 3]) == 1
    assert not index.apply(1, KVEventBatch(3.0, [AllBlocksCleared()]))           # not newer
    assert index.hashes() == {1, 4} and index.last_seq == 1
    assert index.apply(4, KVEventBatch(4.0, [AllBlocksCleared()]))               # 2, 3 lost
    assert (len(index), index.parents, index.last_seq, index.gaps, index.missed) == (0, {}, 4, 1, 2)
    with pytest.raises(ValueError, match="seq must be an int >= 0, got -3"):
        index.apply(-3, KVEventBatch(0.0, []))


def test_index_without_sockets_refuses_network_calls():
    index = KVIndex()
    with pytest.raises(ValueError, match="needs a connected index"):
        index.poll(0)
    with pytest.raises(ValueError, match="needs a replay endpoint"):
        index.catch_up()
    index.close()                                        # nothing to close: no error


# ---- vLLM's current encoding: tagged-map events in a positional batch ------------------------
def test_the_default_encoding_is_vllms_tagged_maps_in_a_positional_batch():
    events = [BlockStored([11, 12], None, toks(0, 8), 4, None, "GPU"),
              BlockRemoved([12], "GPU"), AllBlocksCleared()]
    payload = encode_batch(1.5, events, 0)
    assert raw(payload) == [1.5, [
        {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
         "token_ids": toks(0, 8), "block_size": 4, "lora_id": None, "medium": "GPU",
         "lora_name": None},
        {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"},
        {"type": "AllBlocksCleared"}], 0]
    assert list(raw(payload)[1][0]) == ["type", "block_hashes", "parent_block_hash", "token_ids",
                                        "block_size", "lora_id", "medium", "lora_name"]
    assert decode_batch(payload) == decode_batch(encode_batch(1.5, events, 0, encoding="array"))
    assert decode_batch(payload) == KVEventBatch(1.5, events, 0)


def test_vllms_own_structs_decode_the_default_encoding_and_refuse_the_older_one():
    from tests.kvevents import vllm_structs as V
    events = [BlockStored([2**64 - 1, 7], 3, toks(0, 8), 4, None, "GPU"),
              BlockRemoved([7], "GPU"), AllBlocksCleared()]
    got = V.DECODER.decode(encode_batch(2.5, events, 1))
    assert got == V.KVEventBatch(2.5, [
        V.BlockStored([2**64 - 1, 7], 3, toks(0, 8), 4, None, "GPU", None),
        V.BlockRemoved([7], "GPU"), V.AllBlocksCleared()], 1)
    with pytest.raises(msgspec.ValidationError, match=r"Expected `object`, got `array` - at `\$\[1\]\[0\]`"):
        V.DECODER.decode(encode_batch(2.5, events, 1, encoding="array"))


def test_a_vllm_stream_decodes_bytes_hashes_and_optional_fields_included():
    from tests.kvevents import vllm_structs as V
    sent = V.KVEventBatch(3.0, [
        V.BlockStored([b"\x01" * 32], None, [1, 2], 2, None, "GPU", "adapter",
                      extra_keys=[("salt",)], group_idx=0, kv_cache_spec_kind="full"),
        V.BlockRemoved([b"\x01" * 32], "GPU", group_idx=0)], None)
    batch = decode_batch(msgspec.msgpack.encode(sent))
    assert batch.events == [BlockStored([b"\x01" * 32], None, [1, 2], 2, None, "GPU"),
                            BlockRemoved([b"\x01" * 32], "GPU")]
    index = KVIndex()
    index.apply(0, KVEventBatch(3.0, batch.events[:1]))
    assert b"\x01" * 32 in index and len(index) == 1
    index.apply(1, KVEventBatch(3.0, batch.events[1:]))
    assert len(index) == 0


def test_kvindex_reads_both_encodings_to_the_same_pages():
    c, pool = RadixCache(4, enable_events=True), SlotPool(64, 4)
    for seq in (toks(0, 12), toks(0, 4) + toks(40, 8)):
        c.insert(key(seq), pool.alloc(len(seq)))
    wire = to_wire(c.events().take(), 4)
    by_map, by_array = KVIndex(), KVIndex()
    by_map.apply(0, decode_batch(encode_batch(0.0, wire)))
    by_array.apply(0, decode_batch(encode_batch(0.0, wire, encoding="array")))
    hashes = page_hashes(toks(0, 12), (None, None), 4)
    assert by_map.prefix_match(hashes) == by_array.prefix_match(hashes) == 3
    assert by_map.prefix_match(page_hashes(toks(0, 4) + toks(40, 8), (None, None), 4)) == 3
    assert by_map.hashes() == by_array.hashes() and len(by_map) == 5


def test_a_mixed_or_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match="malformed KV event batch"):
        decode_batch(msgspec.msgpack.encode([1.0, [["AllBlocksCleared"], {"type": "AllBlocksCleared"}]]))
    with pytest.raises(ValueError, match="unknown KV event encoding 'json'; valid: map, array"):
        encode_batch(0.0, [], encoding="json")


def _chained(tokens, namespace, page_size, algo, salt_first_only=False):
    """page_hashes by its definition: one chain_hash per page, nothing memoised."""
    k = key(tokens, namespace)
    inner = (k.namespace[0], None) if salt_first_only else k.namespace
    out, parent = [], None
    for i in range(len(k) // page_size):
        parent = chain_hash(parent, k.namespace if i == 0 else inner, k.page(i, page_size), algo)
        out.append(parent)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=300), st.lists(st.integers(0, 3), max_size=140),
       st.integers(0, 300), st.sampled_from([1, 2, 16]),
       st.sampled_from([(None, None), ("lora", None), (None, "salt"), ("x", "y")]),
       st.booleans(), st.sampled_from(["sha256", "xxhash"]))
def test_page_hashes_memoised_by_span_equal_the_plain_chain(base, tail, cut, ps, ns, first, algo):
    # regression: the span memo (64 pages per lookup) must agree with the per-page chain for
    # prompts that share a prefix, end mid-span, or differ inside a span seen before
    for t in (base, base[:cut] + tail, base + tail):
        want = _chained(t, ns, ps, algo, first)
        assert page_hashes(t, ns, ps, algo, salt_first_only=first) == want
        # the gateway's path: no per-page memo (its caches are remote), the same hashes
        assert page_hashes(t, ns, ps, algo, salt_first_only=first, memo=False) == want


def _event_lists():
    """Batches of cache events over a few hashes: chained and unchained stored pages (some
    stored twice), removed ones (some unknown), clears."""
    ev = st.one_of(
        st.builds(lambda h, p: KVEvent("stored", h, p, (h, h)), st.integers(0, 12),
                  st.one_of(st.none(), st.integers(0, 12))),
        st.builds(lambda h: KVEvent("removed", h), st.integers(0, 14)),
        st.just(KVEvent("cleared")))
    return st.lists(st.lists(ev, max_size=12), max_size=8)


@settings(max_examples=300, deadline=None)
@given(batches=_event_lists(), skips=st.lists(st.integers(1, 3), min_size=8, max_size=8))
def test_apply_kv_holds_what_apply_of_the_wire_batch_holds(batches, skips):
    """The cluster's path (a cache's KV events applied directly) and the wire path (to_wire,
    then apply) leave the same pages, counts, parents, sequence, gaps and misses."""
    direct, wire = KVIndex(), KVIndex()
    seq = -1
    for events, skip in zip(batches, skips):
        seq += skip
        assert direct.apply_kv(seq, events, 2) == wire.apply(seq, KVEventBatch(0.0, to_wire(events, 2)))
        assert direct._held == wire._held and direct.parents == wire.parents
        assert (direct.last_seq, direct.gaps, direct.missed) == (wire.last_seq, wire.gaps, wire.missed)
    if direct.last_seq >= 0:
        assert not direct.apply_kv(direct.last_seq, [KVEvent("cleared")], 2)     # not newer
        assert (direct._held, direct.parents) == (wire._held, wire.parents)


def test_apply_kv_refuses_a_bad_event_before_changing_anything():
    index = KVIndex()
    index.apply_kv(0, [stored(1, None, [1, 2])], 2)
    for bad, msg in (([stored(2, 1, [1, 2]), stored(3, 2, [1])], "has 1 tokens, not block_size 2"),
                     ([KVEvent("removed", 1), KVEvent("moved", 2)], "unknown KV event kind 'moved'")):
        with pytest.raises(ValueError, match=msg):
            index.apply_kv(1, bad, 2)
        assert index.hashes() == {1} and index.last_seq == 0
