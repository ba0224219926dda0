"""Ray Serve's `PrefixCacheAffinityRouter`: power of two choices by default; prefix affinity
while the load is balanced.

When the spread of the replicas' queue lengths (max - min) is under imbalanced_threshold, the
replicas whose prefix tree matches the longest prefix of the prompt are the candidates if the
match rate (matched / prompt tokens) is at least match_rate_threshold, else the replicas with
the smallest trees; otherwise every replica is. Power of two choices picks among the candidates
(the shorter queue of two drawn at random), and the prompt is inserted into the chosen
replica's tree. The tree is built from the requests the router sent; it is not pruned (Ray's
eviction loop is off by default).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from radixkv.router.approxtree import ApproxTree
from radixkv.router.base import ReplicaView, RequestInfo, Router, RouterContext
from radixkv.router.simple import two_choices
from radixkv.argcheck import fraction, int_at_least


@dataclass(frozen=True)
class RayPrefixOptions:
    imbalanced_threshold: int = 10
    match_rate_threshold: float = 0.1

    def __post_init__(self):
        int_at_least(self.imbalanced_threshold, "ray-prefix-affinity imbalanced_threshold", 0)
        fraction(self.match_rate_threshold, "ray-prefix-affinity match_rate_threshold")


class RayPrefixAffinity(Router, name="ray-prefix-affinity"):
    """Prefix affinity among balanced replicas, power of two choices otherwise (the rule in the
    module docstring), over one multi-tenant tree of the prompts sent."""
    Options = RayPrefixOptions

    def __init__(self, context: RouterContext, options: RayPrefixOptions | None = None):
        super().__init__(context, options)
        self.tree = ApproxTree()
        self.rng = random.Random(context.seed)

    def candidates(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> list[int]:
        queues = [v.queue_len for v in replicas]
        if max(queues) - min(queues) >= self.options.imbalanced_threshold:
            return list(range(self.n))
        matched, holders = self.tree.match(request.tokens)
        if holders and matched / request.prompt_len >= self.options.match_rate_threshold:
            return sorted(holders)
        return self.tree.smallest_tenants(range(self.n))

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        return two_choices(self.rng, self.candidates(request, replicas), replicas)

    def on_route(self, replica: int, request: RequestInfo) -> None:
        self.tree.insert(request.tokens, self.check_replica(replica), request.arrival)
