"""Waiting-queue orders, retraction orders and in-batch prefix dedup.

Cache-aware orders ask the cache through the CacheManager's memoised pure-read match
(`OrderContext.prefix`): a match is recomputed only when the cache says it may have changed
(for the radix tree: its last node was evicted, that node's children changed, or the cache was
reset). That keeps LPM cache-aware with thousands waiting, where SGLang falls back to FCFS
past 128.
"""
from __future__ import annotations

import random

import numpy as np
from typing import Any, Callable

from radixkv.cache.manager import CacheManager
from radixkv.cache.radix import RadixCache
from radixkv.registry import Registry
from radixkv.sched.request import Request


class OrderContext:
    """What an order may read: the cache (through the manager), the running requests, an RNG."""

    def __init__(self, mgr: CacheManager, running: list[Request], seed: int = 0):
        self.mgr, self.running = mgr, running
        self.rng = random.Random(seed)

    def prefix(self, req: Request) -> tuple[int, Any]:
        """(cached prefix length, last node) of the request's next admission match."""
        return self.mgr.cached_prefix(req, req.match_key())


# A queue order: f(waiting, ctx) -> the waiting requests in admission order.
QueueOrder = Callable[[list[Request], OrderContext], list[Request]]
QUEUE_ORDERS: Registry[QueueOrder] = Registry("queue policy")

# A retraction order: the running request with the largest key is retracted first.
RETRACT_ORDERS: Registry[Callable[[Request], tuple]] = Registry("retract policy")
RETRACT_ORDERS.add("most-remaining", lambda r: (r.remaining_decode, -len(r.output), r.index))
RETRACT_ORDERS.add("least-progress", lambda r: (-len(r.output), r.prompt_len, r.index))
RETRACT_ORDERS.add("newest", lambda r: (r.first_admit or 0.0, r.index))


@QUEUE_ORDERS.register("fcfs")
def fcfs(waiting, ctx):
    return waiting                              # the scheduler keeps waiting in arrival order


@QUEUE_ORDERS.register("lpm")
def lpm(waiting, ctx):                          # longest cached prefix first, then fcfs
    return sorted(waiting, key=lambda r: (-ctx.prefix(r)[0], r.arrival, r.index))


@QUEUE_ORDERS.register("lof")
def lof(waiting, ctx):                          # longest remaining output first
    return sorted(waiting, key=lambda r: (-r.remaining_decode, r.arrival, r.index))


@QUEUE_ORDERS.register("random")
def random_order(waiting, ctx):
    out = list(waiting)
    ctx.rng.shuffle(out)
    return out


@QUEUE_ORDERS.register("priority")
def priority(waiting, ctx):                     # higher priority first, fcfs among equals
    return sorted(waiting, key=lambda r: (-r.priority, r.arrival, r.index))


@QUEUE_ORDERS.register("routing-key")
def routing_key(waiting, ctx):
    # requests whose routing key is already running (its KV is hot) first, then the most
    # common keys in the queue together, fcfs within a key
    hot = {r.routing_key for r in ctx.running if r.routing_key is not None}
    count: dict = {}
    for r in waiting:
        count[r.routing_key] = count.get(r.routing_key, 0) + 1
    return sorted(waiting, key=lambda r: (r.routing_key not in hot, -count[r.routing_key]
                                          if r.routing_key is not None else 0,
                                          str(r.routing_key), r.arrival, r.index))


@QUEUE_ORDERS.register("dfs-weight")
def dfs_weight(waiting, ctx):
    """SGLang's DFS weighting: walk the tree, heavier subtrees (more waiting requests ending
    there) first, so requests sharing a prefix are admitted together. As in SGLang the walk is
    post-order: a node's own requests come after its subtree's (deeper matches first), so
    requests that match nothing (at the root) come last. A cache without a tree: fcfs."""
    tree = ctx.mgr.cache.tree()
    if tree is None:
        return fcfs(waiting, ctx)
    root = tree.root()
    at: dict[int, list[Request]] = {}
    weight: dict[int, int] = {}
    for r in waiting:
        _, node = ctx.prefix(r)
        at.setdefault(id(node), []).append(r)
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + 1
            node = tree.parent(node)
    out: list[Request] = []
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:                              # its subtree is out: now its own requests
            out.extend(at.get(id(node), ()))
            continue
        stack.append((node, True))
        kids = [c for c in tree.children(node) if id(c) in weight]    # creation order
        kids.reverse()                            # newest first, then a stable sort by weight:
        kids.sort(key=lambda c: weight[id(c)])    # heaviest popped first, the oldest among equals
        stack.extend((c, False) for c in kids)
    if len(out) < len(waiting):                   # a node not reachable from the root now
        emitted = set(map(id, out))
        out.extend(r for r in waiting if id(r) not in emitted)
    return out


class InBatchDedup:
    """Hold back a request whose cached match is short but which shares a long prefix with a
    request already admitted this round: after that one's prefill it will hit instead.
    Detection uses a scratch radix tree over the round's admitted requests."""

    def __init__(self, check_threshold: int, hold_threshold: int):
        self.check, self.hold = check_threshold, hold_threshold
        self.scratch: RadixCache | None = None    # built when first asked
        self._unseen: list[Request] = []          # admitted, not in the scratch tree yet

    def should_hold(self, req: Request, cached_len: int) -> bool:
        if cached_len > self.check or (not self._unseen and self.scratch is None):
            return False                          # nothing admitted yet: nothing shared
        if self.scratch is None:                  # a round that admits one prompt and stops
            self.scratch = RadixCache(clock=lambda: 0.0)      # never builds the tree
        for r in self._unseen:
            key = r.match_key()
            self.scratch.insert(key, np.arange(len(key)))     # distinct slots: lengths matter
        self._unseen.clear()
        shared = self.scratch.match_prefix(req.match_key(), split=False).prefix_len
        return shared > cached_len and shared - cached_len >= self.hold   # hold=0: share something

    def admitted(self, req: Request) -> None:
        self._unseen.append(req)
