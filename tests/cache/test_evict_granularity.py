"""RadixCache eviction granularity: "node" evicts whole leaves, "page" exactly the pages asked
for, trimmed from the end of the least-recent leaf. Exact scenarios, then a stateful property
test against a per-page LRU reference."""
from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixkv.cache.events import KVEvent, chain_hash
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.cache.radix.node import is_candidate
from radixkv.commands.flags import CACHE_FLAGS, cache_config
from radixkv.config import CacheConfig

from tests.cache._helpers import FakeClock, check_tree_and_pool, depth_len, key, toks


def _tree(ps=1, **kw):
    return RadixCache(page_size=ps, clock=FakeClock(), evict_granularity="page", **kw)


def _insert(tree, tokens, slots, t=None):
    if t is not None:
        tree.clock.t = t
    res = tree.insert(key(tokens), np.asarray(slots, dtype=np.int64))
    tree.check_invariants()
    return res


def _next_candidate(tree):
    """The node the next evict() takes first: the smallest live heap entry."""
    live = [e for e in tree.evictor.heap if e[-2] == e[-1].hv and is_candidate(e[-1])]
    return min(live, key=lambda e: e[:-1])[-1]


# ---- scenarios ---------------------------------------------------------------------------
def test_trims_exactly_the_tail_of_the_leaf():
    tree = _tree()
    leaf = _insert(tree, toks(0, 10), np.arange(100, 110)).last_node
    node_id, hv = leaf.id, leaf.hv
    freed = tree.evict(3)
    assert freed.tolist() == [107, 108, 109]
    assert leaf.key.tokens == toks(0, 7) and leaf.value.tolist() == list(range(100, 107))
    assert leaf.id == node_id and leaf.parent is tree.root and leaf.hv == hv
    assert tree.total_size() == tree.evictable_size() == 7 and tree.num_nodes() == 2
    assert _next_candidate(tree) is leaf
    tree.check_invariants()
    assert tree.evict(1).tolist() == [106]                   # still the first candidate
    tree.check_invariants()


def test_node_granularity_is_unchanged():
    tree = RadixCache(clock=FakeClock(), evict_granularity="node")
    assert tree.evict_granularity == "node"
    _insert(tree, toks(0, 10), np.arange(10))
    assert tree.evict(3).tolist() == list(range(10))
    assert tree.total_size() == 0 and tree.num_nodes() == 1


def test_page_size_rounds_up_to_whole_pages():
    tree = _tree(ps=4)
    leaf = _insert(tree, toks(0, 12), np.arange(12)).last_node
    freed = tree.evict(5)
    assert freed.tolist() == list(range(4, 12))              # 2 pages, from the end
    assert len(leaf.key) == 4 and leaf.value.tolist() == [0, 1, 2, 3]
    assert tree.total_size() == 4
    tree.check_invariants()
    assert tree.evict(0).tolist() == []
    assert tree.evict(4).tolist() == [0, 1, 2, 3]            # the last page: the leaf goes
    assert tree.num_nodes() == 1 and tree.total_size() == 0
    tree.check_invariants()


def test_eviction_across_two_leaves():
    tree = _tree()
    _insert(tree, toks(0, 4), np.arange(0, 4), t=1)          # older
    b = _insert(tree, toks(50, 6), np.arange(10, 16), t=2).last_node
    freed = tree.evict(6)
    assert sorted(freed.tolist()) == [0, 1, 2, 3, 14, 15]    # all of the first, 2 of the second
    assert b.key.tokens == toks(50, 4) and tree.total_size() == 4 and tree.num_nodes() == 2
    tree.check_invariants()


def test_cascade_into_the_parent_within_one_call():
    tree = _tree()
    _insert(tree, toks(0, 8), np.arange(8), t=1)
    _insert(tree, toks(0, 4) + toks(100, 4), np.r_[np.arange(4), np.arange(20, 24)], t=2)
    # root -> [0..3] (t2) -> {[4..7] (t1), [100..103] (t2)}
    freed = tree.evict(6)
    assert sorted(freed.tolist()) == [4, 5, 6, 7, 22, 23]    # old leaf whole, then 2 of the other
    assert tree.total_size() == 6
    freed = tree.evict(4)                                     # rest of that leaf, then the parent
    assert sorted(freed.tolist()) == [2, 3, 20, 21]
    assert tree.total_size() == 2 and tree.num_nodes() == 2
    tree.check_invariants()


def test_trimmed_node_grows_back():
    tree = _tree()
    leaf = _insert(tree, toks(0, 10), np.arange(100, 110), t=1).last_node
    tree.evict(3)
    m = tree.match_prefix(key(toks(0, 10)), split=False)
    assert m.prefix_len == 7 and m.slots.tolist() == list(range(100, 107))
    res = _insert(tree, toks(0, 10), np.arange(200, 210), t=2)
    assert res.prefix_len == 7 and res.last_node.parent is leaf
    assert leaf.last_access == 2
    m = tree.match_prefix(key(toks(0, 12)))
    assert m.prefix_len == 10
    assert m.slots.tolist() == list(range(100, 107)) + [207, 208, 209]
    # a diverging insert splits the trimmed edge where it stops agreeing
    _insert(tree, toks(0, 5) + [999], np.arange(300, 306), t=3)
    m = tree.match_prefix(key(toks(0, 10)), split=False)
    assert m.prefix_len == 10 and m.slots.tolist() == list(range(100, 107)) + [207, 208, 209]
    tree.check_invariants()


def test_locked_nodes_are_never_trimmed():
    tree = _tree()
    a = _insert(tree, toks(0, 8), np.arange(8), t=1).last_node        # least recent, locked
    _insert(tree, toks(50, 4), np.arange(10, 14), t=2)
    tree.inc_lock_ref(a)
    freed = tree.evict(2)
    assert freed.tolist() == [12, 13]
    assert len(a.key) == 8 and tree.protected_size() == 8
    assert sorted(tree.evict(100).tolist()) == [10, 11]       # only what is unlocked
    assert len(a.key) == 8 and tree.total_size() == 8
    tree.check_invariants()
    tree.dec_lock_ref(a)
    assert tree.evict(3).tolist() == [5, 6, 7]
    tree.check_invariants()


def test_a_lock_below_protects_the_shared_prefix():
    tree = _tree()
    _insert(tree, toks(0, 8), np.arange(8), t=1)
    b = _insert(tree, toks(0, 4) + toks(100, 4), np.r_[np.arange(4), np.arange(20, 24)], t=2)
    tree.inc_lock_ref(b.last_node)
    assert sorted(tree.evict(100).tolist()) == [4, 5, 6, 7]  # the shared [0..3] has a child
    assert tree.total_size() == 8
    tree.check_invariants()


def test_removed_events_are_the_trimmed_pages_hashes():
    ns = ("lora", None)
    tree = _tree(ps=2, enable_events=True)
    tree.events().take()
    k = toks(100, 8)
    leaf = tree.insert(key(k, ns), np.arange(8)).last_node
    stored = tree.events().take()
    parent, hashes = None, []
    for i in range(4):
        hashes.append(chain_hash(parent, ns, np.array(k[2 * i:2 * i + 2], dtype="=u4").tobytes()))
        parent = hashes[-1]
    assert [e.block_hash for e in stored] == hashes
    assert tree.evict(3).tolist() == [4, 5, 6, 7]
    assert tree.events().take() == [KVEvent("removed", h, namespace=ns) for h in hashes[2:]]
    assert leaf.hashes == hashes[:2]
    # regrowing chains on the trimmed node's last remaining page
    tree.insert(key(k[:4] + [7, 7], ns), np.arange(20, 26))
    ev = tree.events().take()
    assert [e.kind for e in ev] == ["stored"] and ev[0].parent_hash == hashes[1]
    tree.evict(100)
    assert sorted(e.block_hash for e in tree.events().take()) == sorted([*hashes[:2], ev[0].block_hash])


def test_trim_invalidates_pure_read_match_stamps():
    tree = _tree()
    leaf = _insert(tree, toks(0, 10), np.arange(10), t=1).last_node
    full = tree.match_prefix(key(toks(0, 10)), split=False)
    assert full.last_node is leaf
    part = tree.match_prefix(key(toks(0, 9) + [999]), split=False)   # ends inside the edge
    assert part.prefix_len == 9 and part.last_node is tree.root
    stamps = [(m.last_node, tree.admission().stamp(m.last_node)) for m in (full, part)]
    tree.evict(2)
    for node, stamp in stamps:
        assert not tree.admission().still_valid(node, stamp)


def test_bad_granularity_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match=r"unknown evict granularity 'leaf'; valid: node, page"):
        RadixCache(evict_granularity="leaf")
    with pytest.raises(ValueError, match=r"CacheConfig\.evict_granularity: unknown evict "
                                         r"granularity 'pages'; valid: node, page"):
        CacheConfig("radix", 1, "lru", evict_granularity="pages")
    with pytest.raises(ValueError, match="evict granularity"):
        CacheConfig("blockhash", 16, evict_granularity=None)


def test_config_passes_the_granularity_to_the_radix_cache():
    # page is the configured default (measured: it never hit less than node, and up to 3.5
    # points more when the pool is tight), in Python as on the command line
    assert CacheConfig().evict_granularity == "page"
    assert CacheConfig().build().evict_granularity == "page"
    assert CacheConfig("radix", 4, "lru", evict_granularity="node").build().evict_granularity == "node"
    assert RadixCache().evict_granularity == "page"
    for kind in ("blockhash", "none"):                      # accepted; their evictions are pages already
        assert CacheConfig(kind, 16, evict_granularity="page").build().total_size() == 0


def test_flag():
    cf = CACHE_FLAGS["evict_granularity"]
    assert cf.flag == "--evict-granularity" and cf.valid() == ["node", "page"]
    assert cf.caches == ("radix",) and cf.default == "page"
    assert cache_config("radix", {"evict_granularity": "page"}).evict_granularity == "page"
    with pytest.raises(ValueError, match="--evict-granularity: unknown evict granularity 'x'"):
        cache_config("radix", {"evict_granularity": "x"})


# ---- property test: per-page LRU reference ------------------------------------------------
NAMESPACES = [(None, None), ("lora", "salt")]
MAX_LEN = 16

# (which earlier key to extend, where to cut it, new tokens, namespace index)
key_spec = st.tuples(st.integers(0, 1000), st.integers(0, MAX_LEN),
                     st.lists(st.integers(0, 2), max_size=8), st.integers(0, 1))


class PageLRUMachine(RuleBasedStateMachine):
    """The reference keeps, per cached page (namespace, whole-page token prefix), its slots and
    its last access time (an insert or a splitting match touches every page it covers). evict(n)
    removes ceil(n / page) unlocked pages with no cached extension, least recent first, deeper
    first among equal times. Every step advances the clock, so the tree, whose edges share one
    access time, must agree exactly."""

    def __init__(self):
        super().__init__()
        self.tree = None

    @initialize(ps=st.sampled_from([1, 2, 4]))
    def setup(self, ps):
        self.ps = ps
        self.clock = FakeClock()
        self.pool = SlotPool(2048, ps)
        self.tree = RadixCache(page_size=ps, clock=self.clock, evict_granularity="page")
        self.ref: dict = {}            # (ns, prefix tuple) -> [slots of its last page, time]
        self.history: list = []        # (ns, tokens) seen, to build keys sharing prefixes
        self.locks: list = []          # (node, ns, locked prefix tuple)

    def _key(self, spec):
        idx, cut, suffix, nsi = spec
        base = self.history[idx % len(self.history)][1][:cut] if self.history else ()
        return NAMESPACES[nsi], (list(base) + suffix)[:MAX_LEN]

    def _ref_match(self, ns, tokens):
        ps, i = self.ps, 0
        while i + ps <= len(tokens) and (ns, tuple(tokens[:i + ps])) in self.ref:
            i += ps
        return i

    def _touch(self, ns, tokens, upto):
        for i in range(self.ps, upto + 1, self.ps):
            self.ref[(ns, tuple(tokens[:i]))][1] = self.clock.t

    def _split_match(self, ns, tokens):
        self.clock.t += 1
        exp = self._ref_match(ns, tokens)
        m = self.tree.match_prefix(RadixKey(tokens, *ns))
        assert m.prefix_len == exp
        assert depth_len(m.last_node) == exp
        self._touch(ns, tokens, exp)
        return m

    @rule(spec=key_spec)
    def insert(self, spec):
        self.clock.t += 1
        ns, tokens = self._key(spec)
        n, ps = len(tokens), self.ps
        A = n - n % ps
        slots = self.pool.alloc(n)
        exp = self._ref_match(ns, tokens[:A])
        res = self.tree.insert(RadixKey(tokens, *ns), slots[:n])
        assert res.prefix_len == exp
        for i in range(exp, A, ps):
            self.ref[(ns, tuple(tokens[:i + ps]))] = [slots[i:i + ps].tolist(), 0]
        self._touch(ns, tokens, A)
        self.pool.free(np.concatenate([slots[:exp], slots[A:]]))
        self.history.append((ns, tuple(tokens)))

    @rule(spec=key_spec)
    def match(self, spec):
        self._split_match(*self._key(spec))

    @rule(spec=key_spec)
    def lock(self, spec):
        ns, tokens = self._key(spec)
        m = self._split_match(ns, tokens)
        self.tree.inc_lock_ref(m.last_node)
        self.locks.append((m.last_node, ns, tuple(tokens[:m.prefix_len])))

    @rule(idx=st.integers(0, 1000))
    def unlock(self, idx):
        if self.locks:
            self.tree.dec_lock_ref(self.locks.pop(idx % len(self.locks))[0])

    @rule(n=st.integers(0, 40))
    def evict(self, n):
        ps = self.ps
        locked = self._locked()
        expected = []
        # a page's children (cached one-page extensions) count down as they go
        kids: dict = {}
        for ns, t in self.ref:
            if len(t) > ps:
                kids[(ns, t[:-ps])] = kids.get((ns, t[:-ps]), 0) + 1
        heap = [(v[1], -len(k[1]), k) for k, v in self.ref.items()
                if k not in locked and not kids.get(k)]
        heapq.heapify(heap)
        while len(expected) < math.ceil(n / ps) and heap:
            _, _, k = heapq.heappop(heap)
            expected.append(k)
            ns, t = k
            if len(t) > ps:
                up = (ns, t[:-ps])
                kids[up] -= 1
                if not kids[up] and up not in locked:
                    heapq.heappush(heap, (self.ref[up][1], -len(up[1]), up))
        freed = self.tree.evict(n)
        want = sorted(s for k in expected for s in self.ref[k][0])
        assert sorted(freed.tolist()) == want
        for k in expected:
            del self.ref[k]
        self.pool.free(freed)

    def _locked(self):
        out = set()
        for _, ns, t in self.locks:
            out.update((ns, t[:i]) for i in range(self.ps, len(t) + 1, self.ps))
        return out

    @invariant()
    def agrees(self):
        if self.tree is None:
            return
        tree, ps = self.tree, self.ps
        check_tree_and_pool(tree, self.pool, ps * len(self.ref))
        assert tree.protected_size() == ps * len(self._locked())
        for ns, tokens in self.history:                     # pure reads: nothing is touched
            m = tree.match_prefix(RadixKey(list(tokens), *ns), split=False)
            assert m.prefix_len == self._ref_match(ns, list(tokens))


PageLRUMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPageLRUMachine = PageLRUMachine.TestCase
