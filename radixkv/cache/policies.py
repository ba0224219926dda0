"""Eviction orders as sort keys: the candidate with the smallest key is evicted first.

Each key reads only a node's bookkeeping (last_access, created, hit_count, priority) and ends
with the node id, so ties break by creation order and the order is total and deterministic.
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Any, Callable

from radixkv.registry import Registry

SortKey = Callable[[Any], tuple]
EVICTION_POLICIES: Registry[Callable[..., Any]] = Registry("eviction policy")   # an order or its class


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


# stateful orders (GreedyDual-Size-Frequency, decaying priority) live in cache/orders.py
@EVICTION_POLICIES.register("belady")
def belady(n, oracle) -> tuple:
    # future-aware (simulation only, so the oracle is a required option): the leaf whose next
    # use is furthest ahead goes first; `oracle.next_use(node)` is inf when never used again
    return (-oracle.next_use(n), n.id)


def make_sort_key(name: str, **params) -> SortKey:
    """The sort key for policy `name` with its options bound. Unknown names, unknown options
    and missing required ones (belady's oracle) raise ValueError here, at construction. A
    stateful order (an EvictionOrder class) is instantiated with the options."""
    fn = EVICTION_POLICIES.get(name)
    stateful = isinstance(fn, type)
    options = list(inspect.signature(fn).parameters.values())[0 if stateful else 1:]
    unknown = sorted(set(params) - {p.name for p in options})
    if unknown:
        raise ValueError(f"eviction policy {name!r} takes no option(s) {unknown}")
    missing = [p.name for p in options if p.default is p.empty and params.get(p.name) is None]
    if missing:
        raise ValueError(f"eviction policy {name!r} needs an {' and an '.join(missing)}: "
                         f"pass {', '.join(m + '=...' for m in missing)}")
    if stateful:
        return fn(**params)
    return partial(fn, **params) if params else fn


from radixkv.cache.orders import CostOrder, RetentionOrder, ReuseOrder  # noqa: E402

EVICTION_POLICIES.add("cost", CostOrder)
EVICTION_POLICIES.add("retention", RetentionOrder)
EVICTION_POLICIES.add("reuse", ReuseOrder)
