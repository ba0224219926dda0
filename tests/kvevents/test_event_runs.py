"""The in-process event path of the cluster simulator: the `sim64` page hash, a radix cache's
EventRuns, and KVIndex applying runs or pages alike."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.cache.events import (EventRun, KVEvent, chain_hash, chain_hashes, chain_run,
                                  removed_events, run_pages)
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.key import RadixKey, pack_tokens
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.hashes import page_hashes

NS = (None, None)


# ---- sim64 ----------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=96), st.integers(1, 5),
       st.sampled_from([1, 2, 4]))
def test_sim64_chains_the_same_wherever_a_run_is_cut(tokens, cut, ps):
    buf = pack_tokens(tokens)
    whole = chain_run(None, NS, buf, ps, "sim64")
    assert len(whole) == len(tokens) // ps
    k = min(cut, len(whole))
    tail = chain_run(whole[k - 1] if k else None, NS, buf[4 * ps * k:], ps, "sim64")
    assert whole[:k] + tail == whole
    one_by_one, parent = [], None
    for i in range(len(whole)):
        parent = chain_hash(parent, NS, buf[4 * ps * i:4 * ps * (i + 1)], "sim64")
        one_by_one.append(parent)
    assert one_by_one == whole
    pages = [buf[4 * ps * i:4 * ps * (i + 1)] for i in range(len(whole))]
    assert chain_hashes(None, NS, pages, "sim64") == whole
    assert list(page_hashes(tokens, NS, ps, "sim64")) == whole


def test_sim64_separates_namespaces_prefixes_and_single_token_changes():
    tokens = list(range(1000, 1064))
    base = page_hashes(tokens, NS, 16, "sim64")
    assert len(set(base)) == 4
    assert page_hashes(tokens, ("k", None), 16, "sim64")[0] != base[0]
    assert page_hashes(tokens, (None, "salt"), 16, "sim64")[3] != base[3]
    for pos in (0, 17, 63):
        changed = tokens.copy()
        changed[pos] += 1
        other = page_hashes(changed, NS, 16, "sim64")
        first = pos // 16
        assert other[:first] == base[:first]          # pages before the change agree
        assert all(a != b for a, b in zip(other[first:], base[first:]))
    # the salted first page only (a block cache's rule) differs from salting every page
    salted = page_hashes(tokens, (None, "s"), 16, "sim64", salt_first_only=True)
    assert salted[0] == page_hashes(tokens, (None, "s"), 16, "sim64")[0]
    assert salted[1:] != page_hashes(tokens, (None, "s"), 16, "sim64")[1:]


def test_sim64_is_not_a_choice_of_the_user_facing_hash_flag():
    from radixkv.cache.events import HASH_ALGOS, check_hash_algo
    assert "sim64" not in HASH_ALGOS and check_hash_algo("sim64") == "sim64"
    with pytest.raises(ValueError, match="'md5'"):
        check_hash_algo("md5")


# ---- EventRun ---------------------------------------------------------------------------------
def _pages_by_hand(run: EventRun, ps: int) -> list[KVEvent]:
    if run.kind == "removed":
        return removed_events(run.hashes, run.namespace)
    if run.kind == "cleared":
        return [KVEvent("cleared")]
    toks = RadixKey._raw(run.tokens, run.namespace).tokens
    parents = [run.parent, *run.hashes]
    return [KVEvent("stored", h, parents[i], tuple(toks[i * ps:(i + 1) * ps]), run.namespace)
            for i, h in enumerate(run.hashes)]


@pytest.mark.parametrize("kind, algo", [("radix", "sha256"), ("radix", "sim64"),
                                        ("blockhash", "sha256"), ("blockhash", "xxhash")])
def test_a_cache_records_runs_and_gives_the_same_pages(kind, algo):
    """Pages stored, shared (a block cache caches identical content twice) and evicted under
    random prompts: every record is an EventRun, the runs expand to the pages by hand, and an
    index fed runs or pages holds exactly the cache's page hashes."""
    rng = random.Random(7)
    if kind == "radix":
        pool, cache = SlotPool(600), RadixCache(page_size=4, enable_events=True, hash_algo=algo)
    else:
        pool = SlotPool(800, page_size=4)
        cache = BlockHashCache(block_size=4, enable_events=True, hash_algo=algo)
    index_pages, index_runs = KVIndex(), KVIndex()
    for step in range(150):
        prefix = rng.choice([[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], []])
        seq = prefix + [rng.randrange(40) for _ in range(rng.randrange(1, 24))]
        if rng.random() < 0.3 and cache.evictable_size():
            pool.free(cache.evict(rng.randrange(1, 20)))
        n = len(seq) // 4 * 4
        if n and pool.available() >= n:
            slots = pool.alloc(n)
            res = cache.insert(RadixKey(seq[:n], cache_salt=rng.choice([None, "s"])), slots)
            if kind == "radix":
                pool.free(slots[:res.prefix_len])     # the tree kept its own copies of those
        runs = cache.events().take_runs()
        assert all(type(r) is EventRun for r in runs)
        pages = run_pages(runs)
        assert pages == [e for r in runs for e in _pages_by_hand(r, 4)]
        assert index_runs.apply_kv(step, runs, 4) and index_pages.apply_kv(step, pages, 4)
        assert index_runs.held_map == index_pages.held_map
        assert index_runs.parents == index_pages.parents
        assert index_runs.hashes() == cache.events().page_hashes()
        cache.check_invariants()


def test_a_trim_after_a_store_leaves_the_recorded_run_whole():
    pool, tree = SlotPool(64), RadixCache(page_size=2, enable_events=True, evict_granularity="page")
    tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), pool.alloc(6))
    stored = tree.events().take_runs()
    assert [len(r.hashes) for r in stored] == [3]
    tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), pool.alloc(6))
    tree.evict(2)                                  # trims the leaf's last page in place
    removed = tree.events().take_runs()
    assert [(r.kind, r.hashes) for r in removed] == [("removed", stored[0].hashes[2:])]
    assert len(stored[0].hashes) == 3 and len(stored[0].pages()) == 3


def test_a_block_cache_records_one_run_per_run_of_new_blocks():
    cache = BlockHashCache(block_size=2, enable_events=True)
    key = RadixKey([1, 2, 3, 4, 5, 6])
    cache.insert(key, np.arange(6))                                  # blocks 0, 1, 2: one run
    (run,) = cache.events().take_runs()
    h = chain_hashes(None, NS, [pack_tokens(t) for t in ([1, 2], [3, 4], [5, 6])])
    assert run == EventRun("stored", h, None, key.buf, NS)
    # block 1 already holds the middle content; blocks 7 and 9 copy the first and last: two
    # runs, the second chained on the middle block's hash
    cache.insert(key, np.concatenate([np.arange(14, 16), np.arange(2, 4), np.arange(18, 20)]))
    assert cache.events().take_runs() == [EventRun("stored", h[:1], None, key.buf[:8], NS),
                                       EventRun("stored", h[2:], h[1], key.buf[16:], NS)]
    assert cache.duplicate_blocks == 2
    cache.evict(4)                                                   # the free queue's head
    assert cache.events().take_runs() == [EventRun("removed", [h[2], h[1]])]
    cache.reset()
    assert cache.events().take_runs() == [EventRun("cleared", [])]


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
@pytest.mark.parametrize("parent, first", [(None, None), (12345, None), (None, ("k", "salt"))])
def test_chain_hashes_without_the_memo_are_the_same(algo, parent, first):
    pages = [pack_tokens([i, i + 1, i + 2]) for i in range(0, 30, 3)]
    want = chain_hashes(parent, ("k", None), pages, algo, first)
    assert chain_hashes(parent, ("k", None), pages, algo, first, memo=False) == want
    one, p = [], parent
    for i, page in enumerate(pages):
        p = chain_hash(p, first if first and i == 0 else ("k", None), page, algo)
        one.append(p)
    assert one == want


# ---- KVIndex: runs and pages, bad batches -----------------------------------------------------
def test_counts_survive_the_fast_paths_a_page_stored_twice_is_removed_twice():
    ix = KVIndex()
    a = EventRun("stored", [11, 12], None, pack_tokens([1, 2, 3, 4]))
    ix.apply_kv(0, [a], 2)
    ix.apply_kv(1, [a], 2)                         # held twice: the slow path counts
    assert ix.held_map == {11: 2, 12: 2}
    ix.apply_kv(2, [EventRun("removed", [11, 12])], 2)
    assert ix.held_map == {11: 1, 12: 1} and ix.parents == {11: None, 12: 11}
    ix.apply_kv(3, [EventRun("removed", [12, 11, 99])], 2)
    assert ix.held_map == {} and ix.parents == {}
    ix.apply_kv(4, [EventRun("stored", [5, 5], None, pack_tokens([1, 2, 3, 4]))], 2)
    assert ix.held_map == {5: 2}                    # a run repeating a hash: counted twice
    ix.apply_kv(5, [EventRun("cleared", [])], 2)
    assert len(ix) == 0 and ix.last_seq == 5


@pytest.mark.parametrize("batch, match", [
    ([EventRun("stored", [1], None, pack_tokens([1, 2, 3]))], "3 tokens, not block_size 2"),
    ([EventRun("flushed", [1])], "unknown KV event kind 'flushed'"),
    ([EventRun("removed", [1]), KVEvent("removed", 2)], "holds KVEvent"),
    ([KVEvent("removed", 2), EventRun("removed", [1])], "holds an EventRun"),
    ([KVEvent("stored", 1, None, (1,))], "1 tokens, not block_size 2"),
])
def test_a_bad_batch_is_refused_whole_and_changes_nothing(batch, match):
    ix = KVIndex()
    ix.apply_kv(0, [KVEvent("stored", 7, None, (1, 2))], 2)
    with pytest.raises(ValueError, match=match):
        ix.apply_kv(1, batch, 2)
    assert ix.held_map == {7: 1} and ix.last_seq == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["stored", "removed", "cleared"]),
                          st.lists(st.integers(0, 6), max_size=5)), max_size=25))
def test_apply_kv_matches_a_page_by_page_reference(ops):
    """Any sequence of page events, applied at C speed, leaves the counts and parents the
    page-by-page rule leaves."""
    ix, held, parents = KVIndex(), {}, {}
    events = []
    for kind, hashes in ops:
        if kind == "cleared":
            events.append(KVEvent("cleared"))
        for i, h in enumerate(hashes if kind != "cleared" else []):
            events.append(KVEvent(kind, h, hashes[i - 1] if i and kind == "stored" else None,
                                  (0, 0) if kind == "stored" else ()))
    for e in events:
        if e.kind == "stored":
            held[e.block_hash] = held.get(e.block_hash, 0) + 1
            parents[e.block_hash] = e.parent_hash
        elif e.kind == "removed":
            n = held.get(e.block_hash, 0)
            if n > 1:
                held[e.block_hash] = n - 1
            elif n == 1:
                del held[e.block_hash]
                parents.pop(e.block_hash, None)
        else:
            held.clear()
            parents.clear()
    ix.apply_kv(0, events, 2)
    assert ix.held_map == held and ix.parents == parents
    bare = KVIndex(parents=False)                 # a router's index: what is held, no tree
    bare.apply_kv(0, events, 2)
    assert bare.held_map == held and bare.parents == {}
