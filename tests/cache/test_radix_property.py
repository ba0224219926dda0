"""Stateful property test: RadixCache against a naive reference, with a SlotPool.

The reference is a dict {(namespace, whole-page token prefix): slots of its last page}: the set
of cached prefixes, closed under taking page prefixes. The longest cached prefix of a key is
found by walking it page by page. Eviction removes exactly the pages whose slots the tree
returns; they must not be locked and no remaining cached prefix may extend them.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixkv.cache.key import RadixKey
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache

from tests.cache._helpers import FakeClock, all_nodes, check_tree_and_pool, depth_len, tree_snapshot

NAMESPACES = [(None, None), ("lora", "salt")]
POLICIES = ["lru", "mru", "fifo", "filo", "lfu", "slru", "priority", "cost", "retention", "reuse"]
TAGS = [None, "a", "b", (1, 3)]
MAX_LEN = 16

# (which earlier key to extend, where to cut it, new tokens, namespace index)
key_spec = st.tuples(st.integers(0, 1000), st.integers(0, MAX_LEN),
                     st.lists(st.integers(0, 2), max_size=8), st.integers(0, 1))


class RadixMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tree = None

    @initialize(ps=st.sampled_from([1, 2, 4]), policy=st.sampled_from(POLICIES))
    def setup(self, ps, policy):
        self.ps = ps
        self.clock = FakeClock()
        self.pool = SlotPool(2048, ps)
        self.tree = RadixCache(page_size=ps, eviction_policy=policy, clock=self.clock)
        self.ref: dict = {}            # (ns, prefix tuple) -> slots of the prefix's last page
        self.history: list = []        # token tuples seen, to build keys sharing prefixes
        self.locks: list = []          # (node, ns, locked prefix tuple)

    # ---- helpers ------------------------------------------------------------------------
    def _key(self, spec):
        idx, cut, suffix, nsi = spec
        base = self.history[idx % len(self.history)][:cut] if self.history else ()
        tokens = (list(base) + suffix)[:MAX_LEN]
        return NAMESPACES[nsi], tokens

    def _ref_match(self, ns, tokens):
        ps, i, parts = self.ps, 0, []
        while i + ps <= len(tokens) and (ns, tuple(tokens[:i + ps])) in self.ref:
            parts.append(self.ref[(ns, tuple(tokens[:i + ps]))])
            i += ps
        return i, (np.concatenate(parts).tolist() if parts else [])

    def _locked_prefixes(self):
        out = set()
        for _, ns, t in self.locks:
            out.update((ns, t[:i]) for i in range(self.ps, len(t) + 1, self.ps))
        return out

    def _check_match(self, ns, tokens, split):
        exp_len, exp_slots = self._ref_match(ns, tokens)
        before = None if split else tree_snapshot(self.tree)
        m = self.tree.match_prefix(RadixKey(tokens, *ns), split=split)
        assert m.prefix_len == exp_len, (tokens, ns, m.prefix_len, exp_len)
        assert m.slots.tolist() == exp_slots
        if split:
            assert depth_len(m.last_node) == exp_len
        else:
            assert tree_snapshot(self.tree) == before
            assert depth_len(m.last_node) <= exp_len
        return m

    # ---- rules --------------------------------------------------------------------------
    @rule(spec=key_spec, priority=st.integers(0, 3), tag=st.sampled_from(TAGS))
    def insert(self, spec, priority, tag):
        self.clock.t += 1
        ns, tokens = self._key(spec)
        n, ps = len(tokens), self.ps
        A = n - n % ps
        slots = self.pool.alloc(n)
        expected_p, _ = self._ref_match(ns, tokens[:A])
        res = self.tree.insert(RadixKey(tokens, *ns), slots[:n], priority=priority, tag=tag)
        assert res.prefix_len == expected_p
        assert depth_len(res.last_node) == A
        if A == 0:
            assert res.last_node is self.tree.root
        for i in range(expected_p, A, ps):
            self.ref[(ns, tuple(tokens[:i + ps]))] = slots[i:i + ps].copy()
        self.pool.free(np.concatenate([slots[:expected_p], slots[A:]]))   # duplicates + tail
        self.history.append(tuple(tokens))

    @rule(spec=key_spec)
    def match_split(self, spec):
        self.clock.t += 1
        self._check_match(*self._key(spec), split=True)

    @rule(spec=key_spec)
    def match_no_split(self, spec):
        self._check_match(*self._key(spec), split=False)

    @rule(spec=key_spec)
    def lock(self, spec):
        self.clock.t += 1
        ns, tokens = self._key(spec)
        m = self._check_match(ns, tokens, split=True)
        self.tree.inc_lock_ref(m.last_node)
        self.locks.append((m.last_node, ns, tuple(tokens[:m.prefix_len])))

    @rule(idx=st.integers(0, 1000))
    def unlock(self, idx):
        if not self.locks:
            return
        node, _, _ = self.locks.pop(idx % len(self.locks))
        self.tree.dec_lock_ref(node)

    @rule(idx=st.integers(0, 1000))
    def unlock_unlocked_fails_cleanly(self, idx):
        # nodes holding no lock of their own: unlocked ones, and those held only from below
        held = {id(n) for n, _, _ in self.locks}
        free_nodes = [n for n in all_nodes(self.tree) if id(n) not in held]
        if not free_nodes:                                     # every node (root too) is held
            return
        node = free_nodes[idx % len(free_nodes)]
        before = tree_snapshot(self.tree)
        with pytest.raises(ValueError, match="dec_lock_ref on (unlocked node|the root)"):
            self.tree.dec_lock_ref(node)
        assert tree_snapshot(self.tree) == before

    @rule(ranks=st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=8))
    def guard(self, ranks):
        # queue-aware eviction: some nodes kept with a queue rank (or the guard lifted)
        nodes = sorted(all_nodes(self.tree), key=lambda n: n.id)
        kept = {id(n): r for n, r in zip(nodes, ranks) if r is not None}
        self.tree.guard().set((lambda n: kept.get(id(n))) if kept else None)

    @rule(n=st.integers(0, 40))
    def evict(self, n):
        ps = self.ps
        ev_before = self.tree.evictable_size()
        prot_before = self.tree.protected_size()
        freed = self.tree.evict(n)
        assert len(freed) == ev_before - self.tree.evictable_size()
        assert self.tree.protected_size() == prot_before
        if n == 0:
            assert len(freed) == 0
        elif n >= ev_before:
            assert self.tree.evictable_size() == 0            # everything unlocked went
        else:
            assert len(freed) >= n
        assert len(freed) % ps == 0
        by_first_slot = {int(v[0]): k for k, v in self.ref.items()}
        locked = self._locked_prefixes()
        for i in range(0, len(freed), ps):
            page = freed[i:i + ps]
            k = by_first_slot[int(page[0])]
            assert self.ref[k].tolist() == page.tolist()
            assert k not in locked, f"evicted locked prefix {k}"
            del self.ref[k]
        for ns, t in self.ref:                                 # no survivor extends an evicted page
            assert len(t) == ps or (ns, t[:-ps]) in self.ref
        self.pool.free(freed)

    # ---- after every step ---------------------------------------------------------------
    @invariant()
    def consistent(self):
        if self.tree is None:
            return
        tree, ps = self.tree, self.ps
        check_tree_and_pool(tree, self.pool, ps * len(self.ref))
        locked = self._locked_prefixes()
        assert locked <= set(self.ref)
        assert tree.protected_size() == ps * len(locked)
        assert tree.evictable_size() == ps * (len(self.ref) - len(locked))
        assert tree.num_nodes() <= 1 + len(self.ref)
        own = {}
        for n, _, _ in self.locks:
            own[id(n)] = own.get(id(n), 0) + 1
        for n in all_nodes(tree):                              # lock_ref = own locks + locks below
            below = sum(c.lock_ref for c in n.children.values())
            assert n.lock_ref == own.get(id(n), 0) + below + (n is tree.root)
        parents = {(ns, t[:-ps]) for ns, t in self.ref}
        for ns, t in self.ref:
            if (ns, t) not in parents:                         # a leaf of the reference
                m = tree.match_prefix(RadixKey(list(t), *ns), split=False)
                assert m.prefix_len == len(t)
                assert m.slots.tolist() == self._ref_match(ns, list(t))[1]


RadixMachine.TestCase.settings = settings(
    max_examples=500, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRadixMachine = RadixMachine.TestCase
