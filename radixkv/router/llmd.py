"""llm-d's precise prefix-cache scheduling: an index of which KV blocks each pod holds, rebuilt
from the pods' KV events, and a weighted sum of scorers, as in llm-d's precise-prefix-cache
guide profile:

  3 x precise-prefix-cache-scorer  the longest run of the prompt's leading blocks a pod holds,
                                   min-max normalised over the pods
  2 x kv-cache-utilization-scorer  1 - the pod's KV usage
  2 x queue-scorer                 (max - q) / (max - min) of the pods' waiting queues (1 when
                                   they are all equal)

The max-score picker takes the highest total, ties broken at random (seeded).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.wire import EventBatch
from radixkv.router.base import Events, ReplicaView, RequestInfo, Router, RouterContext
from radixkv.argcheck import finite_at_least


@dataclass(frozen=True)
class LLMDOptions:
    prefix_weight: float = 3.0
    kv_utilization_weight: float = 2.0
    queue_weight: float = 2.0

    def __post_init__(self):
        for name in ("prefix_weight", "kv_utilization_weight", "queue_weight"):
            finite_at_least(getattr(self, name), f"llm-d-precise {name}", 0)


def min_max(values: Sequence[float], equal: float) -> list[float]:
    """Each value scaled to [0, 1] between the smallest and the largest; `equal` for all when
    they are all the same."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [equal] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


class EventIndexes:
    """One KVIndex per replica, fed in order from the replicas' events."""

    def __init__(self, n: int, page_size: int):
        self.indexes = [KVIndex(parents=False) for _ in range(n)]    # held pages only
        self.page_size = page_size

    def apply(self, replica: int, events: Events) -> None:
        index = self.indexes[replica]
        if isinstance(events, EventBatch):
            index.apply(index.last_seq + 1, events)
        else:                                     # a cache's own events: no wire objects
            index.apply_kv(index.last_seq + 1, events, self.page_size)


class EventRouter(Router):
    """A router that knows what each replica holds from its KV events (one EventIndexes)."""
    uses_events = True

    def __init__(self, context: RouterContext, options=None):
        super().__init__(context, options)
        self.index = EventIndexes(self.n, context.page_size)

    def on_events(self, replica: int, events: Events) -> None:
        self.index.apply(self.check_replica(replica), events)

    def held_index(self, replica: int) -> KVIndex:
        return self.index.indexes[self.check_replica(replica)]


class LLMDPrecise(EventRouter, name="llm-d-precise"):
    Options = LLMDOptions

    def __init__(self, context: RouterContext, options: LLMDOptions | None = None):
        super().__init__(context, options)
        self.rng = random.Random(context.seed)

    def scores(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> list[float]:
        hashes = self.page_hashes(request)
        prefix = min_max([ix.prefix_match(hashes) for ix in self.index.indexes], 0.0)
        queue = min_max([-v.waiting for v in replicas], 1.0)
        o = self.options
        return [o.prefix_weight * p + o.kv_utilization_weight * (1 - v.kv_usage)
                + o.queue_weight * q for p, v, q in zip(prefix, replicas, queue)]

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        scores = self.scores(request, replicas)
        best = max(scores)
        return self.rng.choice([i for i, s in enumerate(scores) if s == best])
