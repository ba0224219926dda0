"""The cache contract stays narrow: PrefixCache's public members are the operations every cache
keeps plus one accessor per optional ability, and each cache answers the accessors it lacks with
None (cache/abilities.py), so no caller needs to know which cache it holds."""
import inspect

import pytest

from radixkv.cache import BlockHashCache, NoCache, RadixCache, RadixKey, SlotPool
from radixkv.cache.abilities import EventLog
from radixkv.cache.base import PrefixCache
from radixkv.cache.host_tier import HostTier

OPERATIONS = {"name", "shares_prefixes", "page_size", "match_prefix", "insert", "evict",
              "inc_lock_ref", "dec_lock_ref", "check_lock", "evictable_size",
              "protected_size", "total_size", "held_slots", "num_entries", "reset",
              "check_invariants", "stats", "describe", "label"}
ACCESSORS = {"events", "pins", "tree", "guard", "admission", "host_tier"}


def public(cls) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_the_base_is_the_operations_and_one_accessor_per_ability():
    assert public(PrefixCache) | {"page_size"} == OPERATIONS | ACCESSORS   # page_size: set in __init__
    assert {n for n in PrefixCache.__abstractmethods__ if not n.startswith("_")} == {
        "evictable_size", "protected_size", "held_slots", "num_entries", "reset"}


def test_no_cache_has_no_abilities():
    c = NoCache()
    assert {a: getattr(c, a)() for a in ACCESSORS} == dict.fromkeys(ACCESSORS)


def test_block_hashing_has_events_and_admission_reads_and_nothing_tree_shaped():
    c = BlockHashCache(4, enable_events=True)
    assert isinstance(c.events(), EventLog) and c.admission() is not None
    assert c.pins() is None and c.tree() is None and c.guard() is None
    assert c.host_tier() is None
    assert BlockHashCache(4).events() is None            # events are built on request


def test_the_tree_has_every_ability_it_was_built_with():
    t = RadixCache(4)
    assert t.events() is None and t.host_tier() is None
    assert t.pins() is not None and t.guard() is not None and t.admission() is not None
    root = t.tree().root()
    assert t.tree().parent(root) is None and t.tree().children(root) == []
    host = HostTier(64, 4)
    t2 = RadixCache(4, enable_events=True, host_tier=host)
    assert isinstance(t2.events(), EventLog) and t2.host_tier() is host


@pytest.mark.parametrize("make", [lambda: RadixCache(4), lambda: BlockHashCache(4)])
def test_the_tree_view_follows_what_is_stored(make):
    c = make()
    pool = SlotPool(64, 4)
    c.insert(RadixKey(list(range(8))), pool.alloc(8))
    c.insert(RadixKey(list(range(4)) + [9, 9, 9, 9]), pool.alloc(8)[:8])
    view = c.tree()
    if view is None:    # block hashing keeps no tree; as vLLM's, insert stores without matching
        assert c.num_entries() == 4 and c.stats()["duplicate_blocks"] == 1
        return
    (edge,) = view.children(view.root())
    assert len(edge.key) == 4 and [len(k.key) for k in view.children(edge)] == [4, 4]
    assert all(view.parent(k) is edge for k in view.children(edge))
    c.check_invariants()
