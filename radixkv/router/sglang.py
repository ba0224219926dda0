"""SGLang's router, `cache_aware` policy: an approximate radix tree per worker, built from the
prompts the router sent (not from what the worker holds).

Load is the router's own count of requests in flight per worker. When the load is
imbalanced, (max - min) > balance_abs_threshold and max > balance_rel_threshold * min, the
request goes to the least loaded worker. Otherwise to the worker whose tree matches the
longest prefix when the match ratio (matched / prompt tokens) exceeds cache_threshold, else to
the worker with the smallest tree. Either way the prompt is inserted into the chosen worker's
tree. Every eviction_interval seconds each worker's tree is pruned (least recently used leaves
first) to max_tree_size tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixkv.router.approxtree import ApproxTree
from radixkv.router.base import ReplicaView, RequestInfo, Router, RouterContext
from radixkv.argcheck import finite_at_least, fraction, int_at_least, positive_int


@dataclass(frozen=True)
class SGLangOptions:
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval: float = 120.0          # seconds
    max_tree_size: int = 2**26                # tokens per worker

    def __post_init__(self):
        fraction(self.cache_threshold, "sglang-cache-aware cache_threshold")
        int_at_least(self.balance_abs_threshold, "sglang-cache-aware balance_abs_threshold", 0)
        finite_at_least(self.balance_rel_threshold, "sglang-cache-aware balance_rel_threshold", 1)
        finite_at_least(self.eviction_interval, "sglang-cache-aware eviction_interval", 0)
        positive_int(self.max_tree_size, "sglang-cache-aware max_tree_size")


class SGLangCacheAware(Router, name="sglang-cache-aware"):
    """The least loaded worker when imbalanced, else the longest tree match (the rule in the
    module docstring), over one multi-tenant tree of the prompts sent, pruned on a timer."""
    Options = SGLangOptions

    def __init__(self, context: RouterContext, options: SGLangOptions | None = None):
        super().__init__(context, options)
        self.tree = ApproxTree()
        self.load = [0] * self.n
        self._last_prune: float | None = None

    def imbalanced(self) -> bool:
        hi, lo = max(self.load), min(self.load)
        o = self.options
        return hi - lo > o.balance_abs_threshold and hi > o.balance_rel_threshold * lo

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        self._maybe_prune(request.arrival)
        if self.imbalanced():
            return min(range(self.n), key=lambda i: (self.load[i], i))
        matched, holders = self.tree.match(request.tokens)
        if holders and matched / request.prompt_len > self.options.cache_threshold:
            # the most recent of the workers holding the match
            return max(holders, key=lambda t: (holders[t], -t))
        return min(self.tree.smallest_tenants(range(self.n)))

    def on_route(self, replica: int, request: RequestInfo) -> None:
        self.load[self.check_replica(replica)] += 1
        self.tree.insert(request.tokens, replica, request.arrival)

    def on_finish(self, replica: int, request: RequestInfo) -> None:
        self.load[self.check_replica(replica)] -= 1

    def _maybe_prune(self, now: float) -> None:
        if self._last_prune is None:
            self._last_prune = now
        elif now - self._last_prune >= self.options.eviction_interval:
            self.tree.prune(self.options.max_tree_size)
            self._last_prune = now
