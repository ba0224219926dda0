"""Session affinity by consistent hashing (vLLM production-stack's session router): a hash
ring with virtual nodes per replica; a request's routing key picks the first virtual node at
or after its hash, so a session stays on one replica. A request without a key goes to the
replica holding the fewest requests."""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from radixkv.router.base import ReplicaView, RequestInfo, Router, RouterContext
from radixkv.argcheck import positive_int


@dataclass(frozen=True)
class SessionHashOptions:
    virtual_nodes: int = 160          # points per replica on the ring (uhashring's default)

    def __post_init__(self):
        positive_int(self.virtual_nodes, "session-hash virtual_nodes")


def _hash(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class SessionHash(Router, name="session-hash"):
    Options = SessionHashOptions

    def __init__(self, context: RouterContext, options: SessionHashOptions | None = None):
        super().__init__(context, options)
        ring = sorted((_hash(f"replica-{r}#{v}"), r) for r in range(self.n)
                      for v in range(self.options.virtual_nodes))
        self._points = [p for p, _ in ring]
        self._owners = [r for _, r in ring]

    def owner(self, key: str) -> int:
        """The replica `key` maps to."""
        i = bisect.bisect_left(self._points, _hash(key)) % len(self._points)
        return self._owners[i]

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        if request.session is None:
            return min(range(self.n), key=lambda i: (replicas[i].queue_len, i))
        return self.owner(request.session)
