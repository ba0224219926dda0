"""Eviction orders as sort keys: the candidate with the smallest key is evicted first.

Each key reads only a node's bookkeeping (last_access, created, hit_count, priority) and ends
with the node id, so ties break by creation order and the order is total and deterministic.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

from radixkv.registry import Registry

SortKey = Callable[[Any], tuple]
EVICTION_POLICIES: Registry[Callable[..., tuple]] = Registry("eviction policy")


@EVICTION_POLICIES.register("lru")
def lru(n) -> tuple:                      # least recently used first
    return (n.last_access, n.id)


@EVICTION_POLICIES.register("mru")
def mru(n) -> tuple:                      # most recently used first
    return (-n.last_access, -n.id)


@EVICTION_POLICIES.register("fifo")
def fifo(n) -> tuple:                     # oldest inserted first
    return (n.created, n.id)


@EVICTION_POLICIES.register("filo")
def filo(n) -> tuple:                     # newest inserted first
    return (-n.created, -n.id)


@EVICTION_POLICIES.register("lfu")
def lfu(n) -> tuple:                      # fewest hits, then least recently used
    return (n.hit_count, n.last_access, n.id)


@EVICTION_POLICIES.register("slru")
def slru(n, threshold: int = 2) -> tuple:
    # segmented LRU: nodes hit >= threshold times sit in the protected segment, evicted last
    return (n.hit_count >= threshold, n.last_access, n.id)


@EVICTION_POLICIES.register("priority")
def priority(n) -> tuple:                 # lower priority first, then LRU
    return (n.priority, n.last_access, n.id)


@EVICTION_POLICIES.register("belady")
def belady(n, oracle=None) -> tuple:
    # future-aware (simulation only): the leaf whose next use is furthest ahead goes first;
    # `oracle.next_use(node)` knows the future (inf when never used again)
    if oracle is None:
        raise ValueError("eviction policy 'belady' needs an oracle that knows future requests")
    return (-oracle.next_use(n), n.id)


def make_sort_key(name: str, **params) -> SortKey:
    """The sort key for policy `name` (ValueError lists the valid names); params bind options."""
    fn = EVICTION_POLICIES.get(name)
    if name == "belady" and params.get("oracle") is None:
        raise ValueError("eviction policy 'belady' needs an oracle that knows future requests")
    if params:
        try:
            fn(_Probe(), **params) if name != "belady" else None
        except TypeError:
            raise ValueError(f"eviction policy {name!r} takes no option(s) {sorted(params)}") from None
        return partial(fn, **params)
    if name == "belady":
        fn(_Probe())                      # raises: no oracle given
    return fn


class _Probe:
    last_access = created = 0.0
    hit_count = priority = id = 0
