"""The radixkv router: route each request to the replica with the least predicted cost, its
TTFT there plus the delay its extra prefill would cause.

What a replica holds is known exactly, page by page, from its KV events (one KVIndex per
replica), and the prompt pages of every request routed there count as held from the moment it
is routed until it finishes (its prefill will store them; by the finish the events say so or
say they were evicted). For each replica r the router predicts

  wait(r) = the prefill time of the new tokens of the requests routed to r whose first token
            has not come back (a replica serves prefills first-come first-served, ahead of
            decode)
  own(r)  = the prefill time of this request's tokens after its longest prefix held on r, in
            chunks of the replica's prefill budget
  cost(r) = wait(r) + own(r) + work_weight * (1 + waiting(r)) * (own(r) - min over r' of own(r'))

all priced by the cost model of one replica (radixkv.sim.costmodel); waiting(r) is the
replica's published queue. wait + own is the predicted TTFT; the last term charges the prefill
a replica would recompute beyond the best placement, once per request it delays: this one and,
by Little's law, about as many later ones as are queued there now (work_weight 0: TTFT alone).
Ties go to the longer held prefix, then the shorter queue, then the lower index.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radixkv.router.base import (ROUTERS, Events, ReplicaView, RequestInfo, Router,
                                 RouterContext)
from radixkv.router.llmd import EventIndexes
from radixkv.validate import finite_at_least


@dataclass(frozen=True)
class RadixKVOptions:
    work_weight: float = 3.0          # cost per second of prefill recomputed, per request delayed
    decode_weight: float = 0.0        # per second of its decode slowed by the batch it joins (0: off)

    def __post_init__(self):
        finite_at_least(self.work_weight, "radixkv work_weight", 0)
        finite_at_least(self.decode_weight, "radixkv decode_weight", 0)


class Flight(NamedTuple):
    replica: int
    hashes: list[int]
    new_tokens: int              # predicted prefill work when routed


class Prediction(NamedTuple):
    ttft: float
    wait: float
    own: float
    hit_tokens: int


@ROUTERS.register("radixkv")
class RadixKVRouter(Router):
    name = "radixkv"
    uses_events = True
    Options = RadixKVOptions

    def __init__(self, context: RouterContext, options: RadixKVOptions | None = None):
        super().__init__(context, options)
        if context.cost is None:
            raise ValueError("router 'radixkv' needs a cost model (RouterContext.cost)")
        self.cost = context.cost
        self.index = EventIndexes(self.n, context.page_size)
        self.inflight: list[dict[int, int]] = [{} for _ in range(self.n)]  # hash -> requests
        self.pending = [0] * self.n          # new tokens routed, first token not back yet
        self._flights: dict[str, Flight] = {}
        self._prefilling: set[str] = set()
        self._last: tuple[str, list[int]] | None = None      # the last route's hashes

    # ---- prediction ---------------------------------------------------------------------------
    def prefill_time(self, prefix: int, new: int) -> float:
        """Seconds to prefill `new` tokens after `prefix` cached ones, one chunk per step."""
        chunk, t = self.context.prefill_chunk, 0.0
        while new > 0:
            n = min(chunk, new)
            t += self.cost.step_time([(prefix, n)], ())
            prefix, new = prefix + n, new - n
        return t

    def held_pages(self, replica: int, hashes: Sequence[int]) -> int:
        """Leading pages of `hashes` the replica holds or will hold (in flight)."""
        index, flying = self.index.indexes[replica], self.inflight[replica]
        for i, h in enumerate(hashes):
            if h not in index and h not in flying:
                return i
        return len(hashes)

    def hit_tokens(self, replica: int, hashes: Sequence[int], prompt_len: int) -> int:
        """Prompt tokens the replica holds or will hold; a match never covers the last one."""
        ps = self.context.page_size
        return min(self.held_pages(replica, hashes) * ps, (prompt_len - 1) // ps * ps)

    def predict(self, request: RequestInfo, hashes: Sequence[int]) -> list[Prediction]:
        n = request.prompt_len
        out = []
        for r in range(self.n):
            hit = self.hit_tokens(r, hashes, n)
            wait = self.prefill_time(0, self.pending[r])
            own = self.prefill_time(hit, n - hit)
            out.append(Prediction(wait + own, wait, own, hit))
        return out

    def decode_time(self, request: RequestInfo, view: ReplicaView) -> float:
        """Seconds of this request's decode in the batch it would join on that replica: its
        output budget in steps, each over every request the replica holds (running or queued)
        at about this request's context."""
        batch = view.running + view.waiting + 1
        ctx = request.prompt_len + request.max_new_tokens // 2
        return request.max_new_tokens * self.cost.step_time((), [ctx] * batch)

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        hashes = self.page_hashes(request)
        self._last = (request.rid, hashes)
        pred = self.predict(request, hashes)
        least = min(p.own for p in pred)
        w, dw = self.options.work_weight, self.options.decode_weight
        dec = [self.decode_time(request, v) for v in replicas] if dw else [0.0] * self.n
        fastest = min(dec)
        return min(range(self.n), key=lambda r: (
            pred[r].ttft + w * (1 + replicas[r].waiting) * (pred[r].own - least)
            + dw * (dec[r] - fastest),
            -pred[r].hit_tokens, replicas[r].queue_len, r))

    # ---- bookkeeping --------------------------------------------------------------------------
    def on_route(self, replica: int, request: RequestInfo) -> None:
        self.check_replica(replica)
        if request.rid in self._flights:
            raise ValueError(f"request {request.rid!r} is already routed")
        last = self._last
        hashes = last[1] if last is not None and last[0] == request.rid else \
            self.page_hashes(request)
        hit = self.hit_tokens(replica, hashes, request.prompt_len)
        flying = self.inflight[replica]
        for h in hashes:
            flying[h] = flying.get(h, 0) + 1
        new = request.prompt_len - hit
        self._flights[request.rid] = Flight(replica, hashes, new)
        self._prefilling.add(request.rid)
        self.pending[replica] += new

    def on_first_token(self, replica: int, request: RequestInfo) -> None:
        if request.rid in self._prefilling:
            self._prefilling.discard(request.rid)
            f = self._flights[request.rid]
            self.pending[f.replica] -= f.new_tokens

    def on_finish(self, replica: int, request: RequestInfo) -> None:
        self.on_first_token(replica, request)
        f = self._flights.pop(request.rid, None)
        if f is None:
            return
        flying = self.inflight[f.replica]
        for h in f.hashes:
            left = flying[h] - 1
            if left:
                flying[h] = left
            else:
                del flying[h]

    def on_events(self, replica: int, events: Events) -> None:
        self.index.apply(self.check_replica(replica), events)
