"""The `reuse` eviction order (learned reuse prediction): exact scenarios for what it learns,
what it evicts first, and what it refuses; invariants checked after every step."""
from __future__ import annotations

import pytest

from radixkv.cache.key import RadixKey
from radixkv.cache.orders import ReuseOrder, reuse_signature
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from tests.cache._helpers import FakeClock, toks, tree_snapshot


class Run:
    """A reuse-ordered tree over a pool, driven by inserts, splitting matches and evictions."""

    def __init__(self, policy: str = "reuse", **kw):
        self.clock = FakeClock()
        self.tree = RadixCache(eviction_policy=policy, clock=self.clock,
                               evict_granularity="node", **kw)
        self.pool = SlotPool(1000)

    def insert(self, tokens, tag=None) -> None:
        self.clock.t += 1
        slots = self.pool.alloc(len(tokens))
        res = self.tree.insert(RadixKey(tokens), slots, tag=tag)
        self.pool.free(slots[:res.prefix_len])
        self.check()

    def hit(self, tokens) -> int:
        self.clock.t += 1
        n = self.tree.match_prefix(RadixKey(tokens), split=True).prefix_len
        self.check()
        return n

    def evict(self, n: int) -> list[list[int]]:
        """Evicts; returns the token paths of the nodes that left."""
        before = {tuple(t) for t in self.cached()}
        freed = self.tree.evict(n)
        self.pool.free(freed)
        self.check()
        return [list(t) for t in sorted(before - {tuple(t) for t in self.cached()})]

    def cached(self) -> list[list[int]]:
        """The token path from the root to every node."""
        out, stack = [], [(self.tree.root, [])]
        while stack:
            node, path = stack.pop()
            for c in node.children.values():
                p = path + list(c.key.tokens)
                out.append(p)
                stack.append((c, p))
        return out

    def check(self) -> None:
        self.tree.check_invariants()
        self.pool.check_conservation(self.tree.held_slots())


def test_a_signature_never_reused_is_learned_and_its_newest_leaf_goes_before_an_old_one():
    r = Run()
    order = r.tree.sort_key
    r.insert(toks(0, 10), tag="chat")
    for i in range(3):                             # three one-shots, each evicted unhit
        r.insert(toks(100 + 10 * i, 10), tag="rag")
        assert r.hit(toks(0, 10)) == 10            # the chat prefix stays the most recent
        assert r.evict(10) == [toks(100 + 10 * i, 10)]
        assert order.counters["rag"] == 2 - i
    assert order.counters == {"chat": 3, "rag": 0}
    r.insert(toks(500, 10), tag="chat")            # older than the next one-shot
    r.insert(toks(600, 10), tag="rag")             # the newest leaf, predicted dead
    assert r.evict(10) == [toks(600, 10)]
    assert r.hit(toks(500, 10)) == 10 and r.hit(toks(0, 10)) == 10


def test_the_same_sequence_under_lru_evicts_the_oldest_live_leaf():
    r = Run("lru")
    r.insert(toks(0, 10), tag="chat")
    for i in range(3):
        r.insert(toks(100 + 10 * i, 10), tag="rag")
        r.hit(toks(0, 10))
        r.evict(10)
    r.insert(toks(500, 10), tag="chat")
    r.insert(toks(600, 10), tag="rag")
    assert r.evict(10) == [toks(0, 10)]


def test_a_finished_conversations_whole_path_goes_first_but_not_a_prefix_hit_since():
    r = Run()
    order = r.tree.sort_key
    order.counters["last"] = 0                     # as learned: final turns are not reused
    r.insert(toks(0, 5), tag="system")             # a shared prefix, hit again below
    r.insert(toks(0, 5) + toks(900, 5), tag="other")
    r.insert(toks(0, 5) + toks(100, 5), tag="t0")  # the conversation: three turns
    assert r.hit(toks(0, 5) + toks(100, 5)) == 10
    r.insert(toks(0, 5) + toks(100, 10), tag="t1")
    assert r.hit(toks(0, 5) + toks(100, 10)) == 15
    r.insert(toks(0, 5) + toks(100, 15), tag="last")
    assert r.hit(toks(0, 5)) == 5                  # the shared prefix: hit since "last" passed
    conv = toks(0, 5) + toks(100, 15)
    # the path below the shared prefix goes deepest-first, before the older live leaf
    assert r.evict(5) == [conv[:20]]
    assert r.evict(5) == [conv[:15]]
    assert r.evict(5) == [conv[:10]]
    assert r.hit(toks(0, 5) + toks(900, 5)) == 10
    assert order.predicted_dead(r.tree.match_prefix(RadixKey(toks(0, 5)), split=False).last_node) is False


@pytest.mark.parametrize("rebuild", [False, True])
def test_the_prediction_is_made_at_insert_and_survives_a_heap_rebuild(rebuild):
    r = Run(bits=1)
    r.insert(toks(0, 10), tag="rag")
    r.insert(toks(100, 10), tag="chat")
    r.insert(toks(200, 10), tag="rag")             # predicted live: "rag" is still at 1
    assert r.evict(10) == [toks(0, 10)]            # unhit: "rag" 1 -> 0
    assert r.tree.sort_key.counters == {"rag": 0}
    r.insert(toks(300, 10), tag="rag")             # predicted dead
    if rebuild:
        r.tree.evictor._rebuild()                     # what heap compaction does
    assert r.evict(10) == [toks(300, 10)]
    assert r.evict(10) == [toks(100, 10)]          # then LRU: chat before the live-keyed rag
    assert r.evict(10) == [toks(200, 10)]


def test_counters_saturate_and_hits_teach_once_per_node():
    r = Run(bits=2, initial=1)                     # counters in [0, 3], starting at 1
    order = r.tree.sort_key
    r.insert(toks(0, 10), tag="a")
    r.hit(toks(0, 10))
    r.hit(toks(0, 10))                             # a second hit teaches nothing more
    assert order.counters == {"a": 2}
    for i in range(3):                             # three more nodes of "a", each hit
        r.insert(toks(300 + 10 * i, 10), tag="a")
        r.hit(toks(300 + 10 * i, 10))
    assert order.counters == {"a": 3}              # saturated
    r = Run(bits=1)                                # counters in [0, 1], starting at 1
    order = r.tree.sort_key
    r.insert(toks(0, 10), tag="a")
    r.hit(toks(0, 10))
    assert order.counters == {"a": 1}
    r.insert(toks(50, 10), tag="b")
    r.evict(10)                                    # b: the least recent, never hit
    r.insert(toks(60, 10), tag="b")
    r.hit(toks(0, 10))
    r.evict(10)
    assert order.counters == {"a": 1, "b": 0}


def test_a_split_gives_the_signature_to_the_prefix_and_the_last_touch_to_both_halves():
    # one outcome per insertion: the hit prefix teaches +1, the unhit suffix leaving teaches
    # nothing (it taught -1 too, and the insertion counted as neither)
    r = Run(bits=2, initial=1)
    order = r.tree.sort_key
    r.insert(toks(0, 10), tag="x")
    node = r.tree.match_prefix(RadixKey(toks(0, 10)), split=False).last_node
    assert (node.sig, node.touch) == ("x", ("x", 0, False))
    r.hit(toks(0, 4) + [999])                      # splits the edge after 4 tokens
    top = r.tree.match_prefix(RadixKey(toks(0, 4)), split=False).last_node
    assert len(top.key) == 4 and (top.sig, top.touch, top.hit_count) == ("x", ("x", 0, False), 1)
    assert (node.sig, node.touch, node.hit_count) == (None, ("x", 0, False), 0)
    assert order.counters == {"x": 2}
    assert r.evict(6) == [toks(0, 10)]             # the suffix leaves unhit
    assert order.counters == {"x": 2}


def test_regression_a_split_prefix_keeps_its_retention_stamp():
    # the prefix half of a split started at retain 0 and went before its unprioritised peers
    r = Run("retention", horizon=100.0)
    r.tree.pins().advance(0.0)
    r.tree.insert(RadixKey(toks(0, 10)), r.pool.alloc(10), priority=2)
    stamp = r.tree.match_prefix(RadixKey(toks(0, 10)), split=False).last_node.retain
    assert stamp == 200.0
    r.hit(toks(0, 4) + [999])
    top = r.tree.match_prefix(RadixKey(toks(0, 4)), split=False).last_node
    assert len(top.key) == 4 and top.retain == stamp


@pytest.mark.parametrize("kw, match", [
    (dict(bits=0), r"reuse counter bits must be an int >= 1, got 0"),
    (dict(bits=2, initial=4), r"initial counter 4 is not an int in \[0, 3\]"),
    (dict(initial=1.5), r"initial counter 1.5 is not an int"),
])
def test_bad_options_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        RadixCache(eviction_policy="reuse", **kw)


def test_an_unhashable_tag_is_refused_and_changes_nothing():
    r = Run()
    r.insert(toks(0, 10), tag="a")
    before, counters = tree_snapshot(r.tree), dict(r.tree.sort_key.counters)
    slots = r.pool.alloc(12)
    with pytest.raises(ValueError, match=r"insert tag \[1\] is not hashable"):
        r.tree.insert(RadixKey(toks(0, 12)), slots, tag=[1])
    r.pool.free(slots)
    assert tree_snapshot(r.tree) == before and r.tree.sort_key.counters == counters
    r.check()


def test_the_signature_is_the_turn_and_the_cached_prefix_in_powers_of_two():
    assert reuse_signature(None, 0) == (None, 0)
    assert reuse_signature(3, 512) == (3, 10)
    assert reuse_signature(40, 2055) == (15, 12)   # turns are capped
    assert isinstance(RadixCache(eviction_policy="reuse").sort_key, ReuseOrder)
