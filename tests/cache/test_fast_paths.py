"""The cache layer's fast paths against naive references: token packing, the first divergence
of two long runs, the pool's three free paths, the radix tree on long keys (edges past the
short-run comparison), and the block-hash cache's deferred pruning of bare nodes."""
from __future__ import annotations

from array import array

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from radixkv.cache.blockhash import cache as blockhash
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.key import RadixKey, first_divergence, pack_tokens
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.offline.replay import replay
from radixkv.workloads import make_workload

from tests.cache.test_blockhash import IndexMachine

SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- packing and divergence ----------------------------------------------------------------
def naive_pack(tokens) -> bytes:
    for t in tokens:
        if not isinstance(t, int):
            raise ValueError(f"token id {t!r} is not an int")
        if not 0 <= t < 2**32:
            raise ValueError(f"token id {t} is out of range [0, 2**32)")
    return array("I", tokens).tobytes()


@given(st.lists(st.one_of(st.integers(-3, 2**32 + 3), st.integers(0, 50), st.just(1.5)), max_size=40))
def test_pack_tokens_is_the_naive_packing(tokens):
    answers = []
    for pack in (naive_pack, pack_tokens, lambda t: pack_tokens(iter(t))):
        try:
            answers.append(pack(tokens))
        except ValueError as e:
            answers.append(str(e))
    assert answers[0] == answers[1] == answers[2]


@SLOW
@given(st.lists(st.integers(0, 3), max_size=1200), st.integers(0, 1200),
       st.lists(st.integers(0, 3), max_size=700))
def test_first_divergence_of_long_runs(base, cut, tail):
    a, b = base, base[:cut] + tail
    want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert first_divergence(RadixKey(a).buf, RadixKey(b).buf) == want
    assert first_divergence(RadixKey(b).buf, RadixKey(a).buf) == want


# ---- the pool's free paths -------------------------------------------------------------------
class NaivePool:
    """A stack of free pages: a freed batch goes on top so that it is popped in its own order,
    pages ascending (ps > 1) or in the given order (ps = 1); every check before any change."""

    def __init__(self, n: int, ps: int):
        self.n, self.ps, self.free = n, ps, list(range(n // ps - 1, -1, -1))
        self.used: set[int] = set()

    def alloc(self, k: int) -> list[int]:
        pages = [self.free.pop() for _ in range(-(-k // self.ps))]
        out = [p * self.ps + j for p in pages for j in range(self.ps)]
        self.used |= set(out)
        return out

    def release(self, slots: list[int]) -> None:
        if any(not 0 <= s < self.n for s in slots):
            raise ValueError("foreign")
        if any(s not in self.used for s in slots):
            raise ValueError("double free")
        if len(set(slots)) != len(slots):
            raise ValueError("twice")
        pages = sorted({s // self.ps for s in slots}) if self.ps > 1 else slots
        if len(pages) * self.ps != len(slots):
            raise ValueError("partial")
        self.used -= set(slots)
        self.free += pages[::-1]


@SLOW
@given(st.sampled_from([(64, 1), (64, 4), (8192, 1), (8192, 4), (65536, 16)]),
       st.lists(st.tuples(st.integers(1, 300), st.integers(0, 6), st.integers(0, 10**6)),
                min_size=1, max_size=30))
def test_every_free_path_is_the_naive_pool(shape, ops):
    """free() of a few slots, of a batch small beside the pool and of a large one, and
    release() of a valid batch (how = 5), keep the naive pool's stack; a bad free raises."""
    n, ps = shape
    pool, ref, held = SlotPool(n, ps), NaivePool(n, ps), []
    for size, how, seed in ops:
        rng = np.random.default_rng(seed)
        if how == 0 and size <= pool.available():
            got = pool.alloc(size)
            assert got.tolist() == ref.alloc(size)
            held.append(got.tolist())
            continue
        if not held:
            continue
        batch = held[seed % len(held)]
        slots = list(batch)
        if how == 1:
            rng.shuffle(slots)                   # a whole batch, any order
        elif how == 2 and len(slots) > 1:
            slots = slots + slots[:1]            # a slot twice
        elif how == 3:
            slots = slots[:max(1, len(slots) - 1)]   # a partial page (ps > 1)
        elif how == 4:
            slots = [n + 5] + slots              # a foreign slot
        try:
            ref.release(slots)
            ok = True
        except ValueError:
            ok = False
        if ok:
            (pool.release if how == 5 else pool.free)(np.array(slots, np.int64))
            held.remove(batch)
        else:
            with pytest.raises(ValueError):
                pool.free(slots)
        assert pool.available() == len(ref.free) * ps
        assert pool._free[:pool._top].tolist() == ref.free
        assert set(np.flatnonzero(pool._in_use).tolist()) == ref.used


# ---- the radix tree on long keys -------------------------------------------------------------
@SLOW
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 900), st.integers(1, 700)),
                min_size=1, max_size=12),
       st.sampled_from([1, 4]), st.booleans())
def test_radix_tree_on_long_keys_is_the_naive_prefix_store(specs, ps, events):
    """Keys of hundreds of tokens sharing cut prefixes: every match (pure and splitting) and
    insert agrees with a list of stored (tokens, slots), the first store of a prefix owning
    its slots; the events name each stored page once."""
    tree, pool = RadixCache(page_size=ps, enable_events=events), SlotPool(1 << 16, ps)
    stored: list[tuple[list[int], list[int]]] = []
    for seed, cut, extra in specs:
        rng = np.random.default_rng(seed)
        base = stored[seed % len(stored)][0] if stored else []
        toks = base[:cut] + rng.integers(0, 3, extra).tolist()
        aligned = len(toks) - len(toks) % ps

        def lcp(t):
            n = next((i for i, (x, y) in enumerate(zip(t, toks)) if x != y), min(len(t), len(toks)))
            return n - n % ps
        best = max((lcp(t) for t, _ in stored), default=0)
        want = [next(s[i] for t, s in stored if lcp(t) > i) for i in range(best)]
        for split in (False, True):
            m = tree.match_prefix(RadixKey(toks), split=split)
            assert (m.prefix_len, m.slots.tolist()) == (best, want)
        new = pool.alloc(len(toks) - best)
        slots = np.concatenate([np.array(want, np.int64), new[:len(toks) - best]])
        res = tree.insert(RadixKey(toks), slots)
        assert res.prefix_len == best <= aligned
        pool.free(new[aligned - best:])          # the partial last page and its spare slots
        stored.append((toks[:aligned], slots[:aligned].tolist()))
        tree.check_invariants()
    if events:
        stored_ev = [e for e in tree.events().take() if e.kind == "stored"]
        assert len(stored_ev) == tree.total_size() // ps
        assert {e.block_hash for e in stored_ev} == tree.events().page_hashes()


# ---- the block-hash cache with bare nodes pruned at once ------------------------------------
class PruneAtOnceMachine(IndexMachine):
    """The reference-checked state machine with every eviction pruning its bare nodes."""

    @initialize(bs=st.sampled_from([1, 2, 4]))
    def setup(self, bs):
        self.saved = blockhash._PRUNE_AT, blockhash._PRUNE_SHARE
        blockhash._PRUNE_AT = blockhash._PRUNE_SHARE = 0
        super().setup(bs)

    def teardown(self):
        if hasattr(self, "saved"):
            blockhash._PRUNE_AT, blockhash._PRUNE_SHARE = self.saved


PruneAtOnceMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestPruneAtOnce = PruneAtOnceMachine.TestCase


@pytest.mark.parametrize("capacity", [5_000, 20_000])
def test_pruning_early_or_late_changes_no_result(monkeypatch, capacity):
    """A replay with invariants (the kept walk included) checked after every request: pruning
    after every eviction and pruning in batches give the same hits, evictions and events."""
    w = make_workload("support", num_users=12, turns=4)
    runs = []
    for at, share in ((0, 0), (blockhash._PRUNE_AT, blockhash._PRUNE_SHARE)):
        monkeypatch.setattr(blockhash, "_PRUNE_AT", at)
        monkeypatch.setattr(blockhash, "_PRUNE_SHARE", share)
        cache = BlockHashCache(block_size=4, enable_events=True)
        s = replay(w, cache, capacity, check=True)
        runs.append((s.hits, s.evicted_tokens, s.orphan_blocks, cache.events().take()))
    assert runs[0] == runs[1]
    assert runs[0][1] > 0


@given(st.integers(0, 6), st.integers(0, 6), st.booleans(), st.booleans())
def test_moving_a_lock_to_an_extending_chain_is_lock_then_unlock(a, b, extend, locked_twice):
    """The manager's lock move (old chain -> the chain its insert returned) leaves the same
    reference counts and free queue as locking the new chain, then unlocking the old one."""
    ends = []
    for fast in (True, False):
        c = BlockHashCache(block_size=2)
        first = list(range(2 * a))
        second = first + list(range(100, 100 + 2 * b)) if extend else list(range(200, 200 + 2 * b))
        old = c.insert(first, np.arange(2 * a)).last_node
        c.insert(list(range(300, 306)), np.arange(100, 106))       # others in the free queue
        new = c.insert(second, np.concatenate([np.arange(2 * a), np.arange(40, 40 + 2 * b)])
                       if extend else np.arange(60, 60 + 2 * b)).last_node
        c.inc_lock_ref(old)
        if locked_twice:
            c.inc_lock_ref(old)
        if fast:
            c._relock(old, new)
        else:
            c._inc_lock(new)
            c._dec_lock(old)
        c.check_invariants()
        ends.append((c.refs.ref.tolist(), c.free_queue_ids()))
    assert ends[0] == ends[1]
