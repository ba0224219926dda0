"""Stateful property tests of CacheManager over RadixCache (page 1 and 4), BlockHashCache
(block 4) and NoCache, each with a 64-slot pool so that admission evicts and refuses.

The reference is a dict {(namespace, whole-page token prefix): [slots of one page holding that
prefix's last page, in registration order]}: one entry per prefix in a radix tree, one per
registered block (duplicates included) in the block-hash cache, none for NoCache. Each rule
predicts from it, before calling the manager, the hit length, whether admission is refused
(and on which check), the slots a request ends up with, the slots returned to the pool, and
what enters the cache. Eviction is only checked for what it may drop (never a locked page,
never a page a surviving radix prefix extends) and for its accounting. After every step:
the cache's content equals the reference, every lock is accounted for, and slots are
conserved over the pool, the cache and every holder.

A second machine checks that `cached_prefix` (the per-owner memo) always answers what a fresh
pure-read match answers, while the cache is changed under it by inserts, splitting matches,
locks, evictions and resets.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixkv.cache.base import CacheReq
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.key import RadixKey
from radixkv.cache.manager import CacheManager
from radixkv.cache.nocache import NoCache
from radixkv.cache.pool import OutOfSlotsError, SlotPool, round_up
from radixkv.cache.radix import RadixCache
from radixkv.cache.radix.node import path_key

from tests.cache._helpers import FakeClock, all_nodes, depth_len, edge_prefixes, tree_snapshot

NAMESPACES = [(None, None), ("lora", None)]
MAX_PROMPT = 16
MAX_HOLDERS = 4
POOL_SLOTS = 32

# (which earlier sequence to extend, where to cut it, new tokens, namespace index)
key_spec = st.tuples(st.integers(0, 1000), st.integers(0, MAX_PROMPT),
                     st.lists(st.integers(0, 2), max_size=12), st.integers(0, 3))


def make_cache(kind: str, clock):
    if kind == "radix1":
        return RadixCache(page_size=1, clock=clock)
    if kind == "radix4":
        return RadixCache(page_size=4, clock=clock)
    if kind == "blockhash4":
        return BlockHashCache(block_size=4)
    return NoCache()


class Live:
    """A request the machine runs: the CacheReq and every token it may ever compute."""

    def __init__(self, req: CacheReq, ns: tuple, toks: list[int]):
        self.req, self.ns, self.toks = req, ns, toks


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.mgr = None

    @initialize(kind=st.sampled_from(["radix1", "radix4", "blockhash4", "none"]))
    def setup(self, kind):
        self.kind = kind
        self.clock = FakeClock()
        self.cache = make_cache(kind, self.clock)
        self.ps = self.cache.page_size
        self.pool = SlotPool(POOL_SLOTS, self.ps)
        self.mgr = CacheManager(self.cache, self.pool)
        self.ref: dict = {}
        self.live: list[Live] = []
        self.history: list[tuple] = []

    # ---- the reference -------------------------------------------------------------------
    def _seq(self, spec):
        idx, cut, suffix, nsi = spec
        base = list(self.history[idx % len(self.history)][:cut]) if self.history else []
        toks = (base + suffix)[:MAX_PROMPT] or [0]
        return NAMESPACES[nsi // 3], toks          # the second namespace one time in four

    def _ref_match(self, ns, toks):
        """(hit length, hit slots) of the reference: whole pages while the prefix is cached."""
        if not self.cache.shares_prefixes:
            return 0, []
        ps, i, out = self.ps, 0, []
        while i + ps <= len(toks) and self.ref.get((ns, tuple(toks[:i + ps]))):
            out.extend(self.ref[(ns, tuple(toks[:i + ps]))][0])
            i += ps
        return i, out

    def _locked_pages(self) -> set[int]:
        """First slot of every cached page some holder locks."""
        ps = self.ps
        return {int(lv.req.slots[i]) for lv in self.live for i in range(0, lv.req.cached_len, ps)}

    def _prune_evicted(self, total_before: int, evicted_before: int):
        """Drop from the reference what the cache no longer holds (only admit and grow evict,
        and they insert nothing, so a held slot still holds the same prefix)."""
        held = {int(s) for a in self.cache.held_slots() for s in a}
        locked = self._locked_pages()
        dropped = 0
        for k in list(self.ref):
            keep = [p for p in self.ref[k] if p[0] in held]
            for p in self.ref[k]:
                if p[0] not in held:
                    assert p[0] not in locked, f"evicted a locked page {k}"
                    dropped += 1
            if keep:
                self.ref[k] = keep
            else:
                del self.ref[k]
        evicted = self.mgr.evicted_tokens - evicted_before
        assert evicted == dropped * self.ps == total_before - self.cache.total_size()
        if self.kind.startswith("radix"):              # a tree drops leaves: no orphans remain
            for ns, t in self.ref:
                assert len(t) == self.ps or (ns, t[:-self.ps]) in self.ref, f"orphan {t}"
        return evicted

    def _expect_share(self, lv: Live):
        """Predict a cache_req: (A, P, new pages) before the call."""
        r, ps = lv.req, self.ps
        T = len(r.key)
        A = T - T % ps
        C = r.cached_len
        toks = r.key.tokens
        if self.kind.startswith("radix"):
            P, _ = self._ref_match(lv.ns, toks[:A])
        else:                                          # no dedup: only its own blocks count
            P = C
        assert C <= P <= A
        new = {(lv.ns, tuple(toks[:i + ps])): tuple(r.slots[i:i + ps].tolist()) for i in range(P, A, ps)}
        return A, P, new

    def _snapshot(self):
        if isinstance(self.cache, RadixCache):
            return tree_snapshot(self.cache)
        if isinstance(self.cache, BlockHashCache):
            c = self.cache
            return sorted((bid, b.ref_cnt) for bid, b in c.blocks.items()), c.free_queue_ids()
        return None

    def _pick(self, idx) -> Live:
        return self.live[idx % len(self.live)]

    def _extend(self, lv: Live, n: int, more: list[int]) -> None:
        """Let the request compute up to `n` more tokens, as far as its slots allow."""
        r = lv.req
        if len(lv.toks) < len(r.key) + n:
            lv.toks = lv.toks + more + [0] * n
        n = min(n, len(r.slots) - len(r.key))
        r.key = RadixKey(lv.toks[:len(r.key) + n], *lv.ns)

    # ---- rules ------------------------------------------------------------------------------
    @precondition(lambda self: self.mgr is not None and len(self.live) < MAX_HOLDERS)
    @rule(spec=key_spec, drop=st.one_of(st.just(1), st.integers(1, MAX_PROMPT)),
          upto=st.integers(0, MAX_PROMPT + 4), reserve=st.integers(0, 12),
          tight=st.one_of(st.none(), st.none(), st.integers(-2, 4)))
    def admit(self, spec, drop, upto, reserve, tight):
        self.clock.t += 1
        ns, toks = self._seq(spec)
        self.history.append(tuple(toks))
        mkey = RadixKey(toks[:max(len(toks) - drop, 0)], *ns)
        req = CacheReq(RadixKey([], *ns))
        ps = self.ps
        p, hit_slots = self._ref_match(ns, mkey.tokens)
        budget = self.mgr.budget()
        newly = len({hit_slots[i] for i in range(0, p, ps)} - self._locked_pages()) * ps
        R = round_up(upto, ps)
        need = max(R - p, 0)
        if tight is not None:                          # a reserve at the edge of what fits
            reserve = max(budget - newly - need + tight, 0)
        pure_refusal = R + reserve > budget and R - p + reserve > budget
        admitted = need + reserve <= budget - newly
        avail, total, evicted0 = self.pool.available(), self.cache.total_size(), self.mgr.evicted_tokens
        snap = self._snapshot()
        got = self.mgr.admit(req, mkey, upto, reserve)
        if not admitted:
            assert got is None
            assert (req.slots.size, req.cached_len, req.last_node) == (0, 0, None)
            assert self.pool.available() == avail and self.cache.total_size() == total
            assert self.mgr.evicted_tokens == evicted0
            if pure_refusal:                           # not even access order changed
                assert self._snapshot() == snap
            return
        assert got == p == req.cached_len
        assert len(req.slots) == p + need
        assert req.slots[:p].tolist() == hit_slots
        evicted = self._prune_evicted(total, evicted0)
        short = need - avail
        if short <= 0:
            assert evicted == 0
        elif self.kind == "blockhash4":                # whole blocks, exactly what is short
            assert evicted == short
        else:
            assert evicted >= short
        assert self.pool.available() == avail + evicted - need
        if isinstance(self.cache, RadixCache):
            assert depth_len(req.last_node) == p
        req.key = RadixKey(toks[:p], *ns)              # what it has computed: the cached prefix
        self.live.append(Live(req, ns, list(toks)))

    @precondition(lambda self: self.mgr is not None and self.live)
    @rule(idxs=st.lists(st.integers(0, 100), min_size=1, max_size=3, unique=True),
          pages=st.integers(1, 3))
    def grow(self, idxs, pages):
        picked = list({id(lv): lv for lv in map(self._pick, idxs)}.values())
        # a bounded request size keeps memory turning over (evictions) instead of hoarded
        picked = [lv for lv in picked if len(lv.req.slots) < MAX_PROMPT + 8]
        if not picked:
            return
        reqs = [lv.req for lv in picked]
        n_each = pages * self.ps
        before = [r.slots.copy() for r in reqs]
        avail, total, evicted0 = self.pool.available(), self.cache.total_size(), self.mgr.evicted_tokens
        need = n_each * len(reqs)
        if need > self.mgr.budget():
            snap = self._snapshot()
            with pytest.raises(OutOfSlotsError):
                self.mgr.grow(reqs, n_each)
            assert [r.slots.tolist() for r in reqs] == [b.tolist() for b in before]
            assert self.pool.available() == avail and self.mgr.evicted_tokens == evicted0
            assert self._snapshot() == snap
            return
        self.mgr.grow(reqs, n_each)
        evicted = self._prune_evicted(total, evicted0)
        assert (evicted == 0) == (need <= avail)
        assert self.pool.available() == avail + evicted - need
        got = []
        for r, b in zip(reqs, before):
            assert r.slots[:len(b)].tolist() == b.tolist() and len(r.slots) == len(b) + n_each
            got.extend(r.slots[len(b):].tolist())
        assert len(set(got)) == need

    def _computed(self, idx, n, more):
        """A tick, then a live request picked and extended: (live entry, request, its
        cached_len and a copy of its slots as they are now)."""
        self.clock.t += 1
        lv = self._pick(idx)
        self._extend(lv, n, more)
        r = lv.req
        return lv, r, r.cached_len, r.slots.copy()

    @precondition(lambda self: self.mgr is not None and self.live)
    @rule(idx=st.integers(0, 100), n=st.integers(0, 6), more=st.lists(st.integers(0, 2), max_size=6))
    def compute_and_share(self, idx, n, more):
        lv, r, C, slots = self._computed(idx, n, more)
        old_node = r.last_node
        A, P, new = self._expect_share(lv)
        freed = self.mgr.cache_req(r, finished=False)
        if not self.cache.shares_prefixes:
            assert freed.size == 0 and r.slots.tolist() == slots.tolist()
            assert (r.cached_len, r.last_node) == (0, None)
            return
        assert freed.tolist() == slots[C:P].tolist()
        for k, page in new.items():
            self.ref.setdefault(k, []).append(page)
        assert r.cached_len == A
        assert r.slots[P:].tolist() == slots[P:].tolist()
        if isinstance(self.cache, RadixCache):         # duplicates switched to the cache's copies
            assert r.slots[:A].tolist() == self._ref_match(lv.ns, r.key.tokens[:A])[1]
            if A == C:
                assert r.last_node is old_node
        else:                                          # no dedup: it keeps every slot
            assert r.slots.tolist() == slots.tolist()

    @precondition(lambda self: self.mgr is not None and self.live)
    @rule(idx=st.integers(0, 100), n=st.integers(0, 6), more=st.lists(st.integers(0, 2), max_size=6))
    def finish(self, idx, n, more):
        lv, r, C, slots = self._computed(idx, n, more)
        A, P, new = self._expect_share(lv)
        avail = self.pool.available()
        freed = self.mgr.cache_req(r, finished=True)
        if not self.cache.shares_prefixes:
            assert freed.tolist() == slots.tolist()
        else:
            assert freed.tolist() == slots[C:P].tolist() + slots[A:].tolist()
            for k, page in new.items():
                self.ref.setdefault(k, []).append(page)
        assert self.pool.available() == avail + len(freed)
        assert (r.slots.size, r.cached_len, r.last_node) == (0, 0, None)
        self.live.remove(lv)

    @precondition(lambda self: self.mgr is not None and self.live)
    @rule(idx=st.integers(0, 100), insert=st.booleans(), n=st.integers(0, 6),
          more=st.lists(st.integers(0, 2), max_size=6))
    def release(self, idx, insert, n, more):
        lv, r, C, slots = self._computed(idx, n, more)
        avail = self.pool.available()
        if insert and self.cache.shares_prefixes:
            A, P, new = self._expect_share(lv)
            returned = slots[C:P].tolist() + slots[A:].tolist()
        else:
            new, returned = {}, slots[C:].tolist()
        self.mgr.release(r, insert=insert)
        for k, page in new.items():
            self.ref.setdefault(k, []).append(page)
        assert self.pool.available() == avail + len(returned)
        assert (r.slots.size, r.cached_len, r.last_node) == (0, 0, None)
        self.live.remove(lv)

    # ---- after every step ---------------------------------------------------------------
    @invariant()
    def consistent(self):
        if self.mgr is None:
            return
        mgr, cache, pool, ps = self.mgr, self.cache, self.pool, self.ps
        mgr.check()
        holders = mgr.holders()
        assert {id(r) for r in holders} == {id(lv.req) for lv in self.live}
        assert pool.used() == cache.total_size() + sum(len(r.slots) - r.cached_len for r in holders)
        assert cache.total_size() == ps * sum(len(v) for v in self.ref.values())
        for lv in self.live:
            r = lv.req
            assert r.cached_len <= len(r.key) <= len(r.slots)
            assert r.cached_len % ps == 0 and len(r.slots) % ps == 0
            for i in range(0, r.cached_len, ps):       # its cached part is in the cache, as locked
                page = tuple(r.slots[i:i + ps].tolist())
                assert page in self.ref[(lv.ns, tuple(r.key.tokens[:i + ps]))]
        locked = self._locked_pages()
        assert cache.protected_size() == ps * len(locked)
        assert cache.evictable_size() == cache.total_size() - cache.protected_size()
        if isinstance(cache, RadixCache):
            self._check_tree(holders)
        elif isinstance(cache, BlockHashCache):
            self._check_blocks(holders)
        else:
            assert all(r.cached_len == 0 and r.last_node is None for r in holders)
            assert cache.total_size() == 0

    def _check_tree(self, holders):
        tree, ps = self.cache, self.ps
        content = {(ns, prefix): [tuple(n.value[i:i + ps].tolist())]
                   for ns, prefix, n, i in edge_prefixes(tree, ps)}
        assert content == self.ref
        own: dict[int, int] = {}
        for r in holders:
            assert depth_len(r.last_node) == r.cached_len
            if r.cached_len:                           # the root's path carries no namespace
                assert path_key(r.last_node) == r.key[:r.cached_len]
            own[id(r.last_node)] = own.get(id(r.last_node), 0) + 1
        for n in all_nodes(tree):                      # lock_ref = own locks + locks below
            below = sum(c.lock_ref for c in n.children.values())
            assert n.lock_ref == own.get(id(n), 0) + below + (n is tree.root)

    def _check_blocks(self, holders):
        c, bs = self.cache, self.ps
        assert {bid * bs for bid in c.blocks} == {page[0] for pages in self.ref.values() for page in pages}
        for (ns, t), pages in self.ref.items():
            h = c.block_hashes(RadixKey(list(t), *ns))[-1]
            assert sorted(c.by_hash[h]) == sorted(page[0] // bs for page in pages)
        refs: dict[int, int] = {}
        for r in holders:
            chain = r.last_node
            assert len(chain) * bs == r.cached_len
            assert [b.id * bs for b in chain] == r.slots[:r.cached_len:bs].tolist()
            for b in chain:
                refs[b.id] = refs.get(b.id, 0) + 1
        assert {bid: b.ref_cnt for bid, b in c.blocks.items() if b.ref_cnt} == refs


ManagerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestManagerMachine = ManagerMachine.TestCase


# ---- the memo --------------------------------------------------------------------------------
class MemoMachine(RuleBasedStateMachine):
    """Owners whose keys only grow (as a request's match key does) ask `cached_prefix` after
    every change; the answer must equal a fresh pure read, node included."""

    def __init__(self):
        super().__init__()
        self.mgr = None

    @initialize(kind=st.sampled_from(["radix1", "radix4", "blockhash4"]),
                 owners=st.lists(st.lists(st.integers(0, 2), max_size=10), min_size=1, max_size=4))
    def setup(self, kind, owners):
        self.kind = kind
        self.clock = FakeClock()
        self.cache = make_cache(kind, self.clock)
        self.ps = self.cache.page_size
        self.pool = SlotPool(2048, self.ps)
        self.mgr = CacheManager(self.cache, self.pool)
        self.owners = [(object(), list(t)) for t in owners]
        self.locks: list = []
        self.history: list = [tuple(t) for t in owners]

    def _key(self, idx, cut, suffix):
        base = list(self.history[idx % len(self.history)][:cut])
        return RadixKey((base + suffix)[:20])

    @precondition(lambda self: self.mgr is not None)
    @rule(idx=st.integers(0, 100), cut=st.integers(0, 20), suffix=st.lists(st.integers(0, 2), max_size=6))
    def insert(self, idx, cut, suffix):
        self.clock.t += 1
        key = self._key(idx, cut, suffix)
        self.history.append(tuple(key.tokens))
        slots = self.pool.alloc(len(key))
        res = self.cache.insert(key, slots[:len(key)])
        A = len(key) - len(key) % self.ps
        if isinstance(self.cache, RadixCache):
            self.pool.free(np.concatenate([slots[:res.prefix_len], slots[A:]]))
        else:
            self.pool.free(slots[A:])

    @precondition(lambda self: self.mgr is not None)
    @rule(idx=st.integers(0, 100), cut=st.integers(0, 20), suffix=st.lists(st.integers(0, 2), max_size=6))
    def lock_split(self, idx, cut, suffix):
        self.clock.t += 1
        m = self.cache.match_prefix(self._key(idx, cut, suffix), split=True)
        self.cache.inc_lock_ref(m.last_node)
        self.locks.append(m.last_node)

    @precondition(lambda self: self.mgr is not None and self.locks)
    @rule(idx=st.integers(0, 100))
    def unlock(self, idx):
        self.cache.dec_lock_ref(self.locks.pop(idx % len(self.locks)))

    @precondition(lambda self: self.mgr is not None)
    @rule(n=st.integers(1, 24))
    def evict(self, n):
        self.pool.free(self.cache.evict(n))

    @precondition(lambda self: self.mgr is not None)
    @rule(idx=st.integers(0, 100), more=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def owner_grows(self, idx, more):
        self.owners[idx % len(self.owners)][1].extend(more)

    @precondition(lambda self: self.mgr is not None)
    @rule()
    def reset(self):
        self.locks.clear()
        self.cache.reset()
        self.pool.reset()

    @invariant()
    def memo_is_never_stale(self):
        if self.mgr is None:
            return
        for owner, toks in self.owners:
            key = RadixKey(toks)
            p, node = self.mgr.cached_prefix(owner, key)
            m = self.cache.match_prefix(key, split=False)
            assert p == m.prefix_len
            if isinstance(self.cache, RadixCache):
                assert node is m.last_node
            else:
                assert len(node) == len(m.last_node) and all(a is b for a, b in zip(node, m.last_node))


MemoMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestMemoMachine = MemoMachine.TestCase
