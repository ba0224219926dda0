"""Waiting-queue orders and in-batch prefix dedup.

Cache-aware orders ask the cache through the pure-read match (split=False), and keep each
request's answer across rounds: a radix match can only change where it ended, so it is
recomputed only when its last node was evicted, that node's children changed (TreeNode.cv),
or the cache was reset (RadixCache.epoch).
That keeps LPM cache-aware with thousands waiting, where SGLang falls back to FCFS past 128.
"""
from __future__ import annotations

import logging
import random
from typing import Callable

from radixkv.cache.base import PrefixCache
from radixkv.cache.radix import RadixCache, TreeNode
from radixkv.registry import Registry
from radixkv.sched.request import Request

log = logging.getLogger(__name__)


class MatchMemo:
    """Pure-read prefix matches of waiting requests, revalidated instead of recomputed."""

    def __init__(self, cache: PrefixCache):
        self.cache = cache
        self._memo: dict[int, tuple] = {}       # id(req) -> (fill, prefix_len, last_node, cv, epoch)
        self.recomputed = self.reused = 0

    def get(self, req: Request) -> tuple[int, object]:
        """(prefix_len, last_node) of req.match_key() in the cache, without mutating it."""
        e = self._memo.get(id(req))
        fill = len(req.tokens)
        if e is not None and e[0] == fill and e[4] == getattr(self.cache, "epoch", 0) \
                and self._valid(e[2], e[3]):
            self.reused += 1
            return e[1], e[2]
        m = self.cache.match_prefix(req.match_key(), split=False)
        node = m.last_node
        self._memo[id(req)] = (fill, m.prefix_len, node, getattr(node, "cv", None),
                               getattr(self.cache, "epoch", 0))
        self.recomputed += 1
        return m.prefix_len, node

    def _valid(self, node, cv) -> bool:
        if not isinstance(node, TreeNode):
            return False                          # other caches: always ask again
        alive = node.parent is not None or node is self.cache.root
        return alive and node.cv == cv

    def forget(self, req: Request) -> None:
        self._memo.pop(id(req), None)


# A policy orders the waiting list: f(waiting, memo, ctx) -> new list. ctx carries the
# running requests and an RNG for the orders that need them.
QueueOrder = Callable[[list[Request], MatchMemo, "OrderContext"], list[Request]]
QUEUE_ORDERS: Registry[QueueOrder] = Registry("queue policy")


class OrderContext:
    def __init__(self, running: list[Request], seed: int = 0):
        self.running = running
        self.rng = random.Random(seed)


@QUEUE_ORDERS.register("fcfs")
def fcfs(waiting, memo, ctx):
    return waiting                              # the scheduler keeps waiting in arrival order


@QUEUE_ORDERS.register("lpm")
def lpm(waiting, memo, ctx):                    # longest cached prefix first, then fcfs
    return sorted(waiting, key=lambda r: (-memo.get(r)[0], r.arrival, r.index))


@QUEUE_ORDERS.register("lof")
def lof(waiting, memo, ctx):                    # longest remaining output first
    return sorted(waiting, key=lambda r: (-r.remaining_decode, r.arrival, r.index))


@QUEUE_ORDERS.register("random")
def random_order(waiting, memo, ctx):
    out = list(waiting)
    ctx.rng.shuffle(out)
    return out


@QUEUE_ORDERS.register("priority")
def priority(waiting, memo, ctx):               # higher priority first, fcfs among equals
    return sorted(waiting, key=lambda r: (-r.priority, r.arrival, r.index))


@QUEUE_ORDERS.register("routing-key")
def routing_key(waiting, memo, ctx):
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
def dfs_weight(waiting, memo, ctx):
    """SGLang's DFS weighting: walk the tree, heavier subtrees (more waiting requests ending
    there) first, so requests sharing a prefix are admitted together. As in SGLang the walk is
    post-order: a node's own requests come after its subtree's (deeper matches first), so
    requests that match nothing (at the root) come last."""
    if not isinstance(memo.cache, RadixCache):
        return fcfs(waiting, memo, ctx)
    at: dict[int, list[Request]] = {}
    weight: dict[int, int] = {}
    for r in waiting:
        _, node = memo.get(r)
        at.setdefault(id(node), []).append(r)
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + 1
            node = node.parent
    out: list[Request] = []
    stack: list[tuple[TreeNode, bool]] = [(memo.cache.root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:                              # its subtree is out: now its own requests
            out.extend(at.get(id(node), ()))
            continue
        stack.append((node, True))
        kids = [c for c in node.children.values() if id(c) in weight]
        kids.sort(key=lambda c: (weight[id(c)], -c.id))
        stack.extend((c, False) for c in kids)    # heaviest popped first
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
        self.scratch = RadixCache(clock=lambda: 0.0)
        self.held = 0

    def should_hold(self, req: Request, cached_len: int) -> bool:
        if cached_len > self.check:
            return False
        shared = self.scratch.match_prefix(req.match_key(), split=False).prefix_len
        if shared > cached_len and shared - cached_len >= self.hold:   # hold=0: share something
            self.held += 1
            return True
        return False

    def admitted(self, req: Request) -> None:
        key = req.match_key()
        self.scratch.insert(key, range(len(key)))
