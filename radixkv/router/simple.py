"""Load-only routers: round-robin, power-of-two choices, least load."""
from __future__ import annotations

import random
from collections.abc import Sequence

from radixkv.router.base import ReplicaView, RequestInfo, Router, RouterContext


class RoundRobin(Router, name="round-robin"):
    """Replicas in turn: 0, 1, ..., N-1, 0, ..."""

    def __init__(self, context: RouterContext, options=None):
        super().__init__(context, options)
        self._next = 0

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        i, self._next = self._next, (self._next + 1) % self.n
        return i


def two_choices(rng: random.Random, candidates: Sequence[int],
                replicas: Sequence[ReplicaView]) -> int:
    """Two distinct candidates drawn at random; the one with the shorter queue (the first drawn
    on a tie). One candidate is returned as is."""
    if len(candidates) == 1:
        return candidates[0]
    a, b = rng.sample(list(candidates), 2)
    return b if replicas[b].queue_len < replicas[a].queue_len else a


class PowerOfTwo(Router, name="power-of-two"):
    """Power of two choices (Ray Serve's default): two replicas at random (seeded), the one
    with the shorter queue."""

    def __init__(self, context: RouterContext, options=None):
        super().__init__(context, options)
        self.rng = random.Random(context.seed)

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        return two_choices(self.rng, range(self.n), replicas)


class LeastLoad(Router, name="least-load"):
    """The replica holding the fewest requests; ties go to the fewest tokens still to prefill
    and decode, then to the lowest index."""

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        return min(range(self.n), key=lambda i: (replicas[i].queue_len,
                                                 replicas[i].prefill_tokens
                                                 + replicas[i].decode_tokens, i))
