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
  cost(r) = wait(r) + own(r)
            + work_weight * (1 + waiting(r)) / (1 - load) * (own(r) - min over r' of own(r'))
            + lock_weight * work_weight / (1 - load) * prefill(displaced(r))

all priced by the cost model of one replica (radixkv.sim.costmodel); waiting(r) is the
replica's published queue. On a disaggregated prefill worker the request's KV then waits for
the transfers queued on the worker's link: the predicted TTFT is wait + own, or the moment the
link is free, whichever is later (the transfer itself takes as long from any worker). wait + own is the predicted TTFT; the next term charges the prefill
a replica would recompute beyond the best placement, once per request it delays: this one and,
by Little's law, about as many later ones as are queued there now (work_weight 0: TTFT alone),
and 1 / (1 - load) times over: a second of work lengthens the busy period it falls in by about
that factor (M/G/1), where load is the fleet's prefill utilisation, the prefill seconds the
router placed over the last `load_window` seconds per replica and second (capped at 0.95). A busy
fleet then keeps a prefix where it is held: at 4 replicas on the Mooncake trace (mean load
0.41) the hit rate rises from 20.2 % to 21.3 %, at 8 from 34.1 % to 34.3 %.
The last term charges the retained prefixes a placement displaces: a replica cannot evict the
KV of its requests in flight (their prompt pages and output budgets), so once those hold more
than `lock_share` of its capacity, every token this request adds beyond that share pushes out
a cached prefix some later request would have hit (Dynamo's "potential active blocks", counted
only past the share). On a shared system prompt held by one small replica (support at 4 x
12,000 tokens, five seeds) the conversations then spread instead of evicting each other's
histories: hit rate 65.9-68.3 % -> 72.5-75.0 %. The share was chosen among 0.3, 0.4, 0.5 and 0.75
on that and on the Mooncake trace, where a lower share spreads more: at 0.3 the 8-replica hit
rate falls below llm-d-precise's.
Ties go to the longer held prefix, then the shorter queue, then the replica sent the fewest new
tokens so far (each replica's cache then takes new prefixes at the same pace and keeps what it
holds as long as the others do; by index order, the first replicas would churn through theirs
while the last idled), then the lower index.

With `fit`, the predicted TTFT is instead a regression fitted online on the TTFTs measured for the
requests routed so far (router/ttft_fit.py: wait and own as above, the requests ahead and
running there, the KV tokens by which the replica's requests in flight would overflow its
capacity, a fixed overhead), the recomputed prefill is priced at the fitted prices of its step
time and tokens (the load counts placed work at those prices too), and costs within
`fit_tie` of the least go to the shorter queue, then to the fewest new tokens sent: for a front
end whose workers' time is not the step cost's (other hardware, a host-bound engine, KV memory
that binds first).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import compress, count
from operator import not_
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from radixkv.kvevents.hashes import PageHashes
from radixkv.router.base import Events, ReplicaView, RequestInfo, RouterContext
from radixkv.router.flying import FlyingPages
from radixkv.router.llmd import EventRouter
from radixkv.router.ttft_fit import TTFTFit
from radixkv.argcheck import finite_at_least, positive_fraction, positive_number


@dataclass(frozen=True)
class RadixKVOptions:
    work_weight: float = 3.0          # cost per second of prefill recomputed, per request delayed
    decode_weight: float = 0.0        # per second of its decode slowed by the batch it joins (0: off)
    fit: bool = False                 # TTFT fitted online to the measured ones (ttft_fit.py)
    fit_window: int = 512             # observations the fit regresses on (the latest)
    fit_tie: float = 0.02             # with `fit`: costs within this share of the least tie
    load_window: float = 30.0         # seconds the fleet's prefill utilisation is averaged over
    lock_share: float = 0.4           # share of a replica's KV its requests in flight may hold
    lock_weight: float = 3.0          # per second of prefill displaced past that share (0: off)

    def __post_init__(self):
        finite_at_least(self.work_weight, "radixkv work_weight", 0)
        finite_at_least(self.decode_weight, "radixkv decode_weight", 0)
        finite_at_least(self.fit_tie, "radixkv fit_tie", 0)
        finite_at_least(self.lock_weight, "radixkv lock_weight", 0)
        positive_fraction(self.lock_share, "radixkv lock_share")
        positive_number(self.load_window, "radixkv load_window")
        if not isinstance(self.fit, bool):
            raise ValueError(f"radixkv fit must be True or False, got {self.fit!r}")


class Flight(NamedTuple):
    replica: int
    new_tokens: int              # predicted prefill work when routed
    budget: int = 0              # its output budget
    features: np.ndarray | None = None     # with `fit`: what the prediction saw, and said
    predicted: float = 0.0


class Prediction(NamedTuple):
    ttft: float
    wait: float
    own: float
    hit_tokens: int


class RadixKVRouter(EventRouter, name="radixkv"):
    Options = RadixKVOptions

    def __init__(self, context: RouterContext, options: RadixKVOptions | None = None):
        super().__init__(context, options)
        if context.cost is None:
            raise ValueError("router 'radixkv' needs a cost model (RouterContext.cost)")
        self.cost = context.cost
        self.inflight = [FlyingPages() for _ in range(self.n)]   # pages routed, not finished
        self.pending = [0] * self.n          # new tokens routed, first token not back yet
        self._flights: dict[str, Flight] = {}
        self._prefilling: set[str] = set()
        self._last: tuple[str, list] | None = None   # the last route's rid, features and TTFTs
        # the last route's rid and hit per replica, until what they read changes (an event, a
        # request routed or finished): on_route takes its replica's without another scan
        self._hits: tuple[str, list[int]] | None = None
        self.flying = [0] * self.n           # requests routed, not finished
        self.ahead = [0] * self.n            # of those, first token not back yet
        self.budget = [0] * self.n           # their output budgets
        self.stored = [0] * self.n           # new tokens routed so far (prefill sent to store)
        self._prefill_s: dict[tuple[int, int], float] = {}   # prefill_time's, by its arguments
        self._busy, self._busy_at = 0.0, None   # prefill seconds placed, decayed over load_window
        self.fit = None
        if self.options.fit:
            one = self.cost.step_time((), [2048])
            running_prior = (self.cost.step_time((), [2048] * 9) - one) / 8   # a decode's share
            overflow_prior = 80 * one              # ~ s per 1,000 tokens freed by finishing decodes
            self.fit = TTFTFit(running_prior, overflow_prior, window=self.options.fit_window)

    # ---- prediction ---------------------------------------------------------------------------
    def prefill_time(self, prefix: int, new: int) -> float:
        """Seconds to prefill `new` tokens after `prefix` cached ones, one chunk per step."""
        t = self._prefill_s.get((prefix, new))
        if t is None:
            chunk, t, p, left = self.context.prefill_chunk, 0.0, prefix, new
            while left > 0:
                n = min(chunk, left)
                t += self.cost.step_time([(p, n)], ())
                p, left = p + n, left - n
            if len(self._prefill_s) >= 1 << 16:
                self._prefill_s.clear()
            self._prefill_s[(prefix, new)] = t
        return t

    def held_pages(self, replica: int, hashes: PageHashes) -> int:
        """Leading pages of `hashes` the replica holds or will hold (in flight)."""
        held, flying = self.index.indexes[replica].held_map, self.inflight[replica]
        n = len(hashes)
        i = next(compress(count(), map(not_, map(held.__contains__, hashes))), n)
        if i == n or not flying:
            return i                              # the first page neither held nor in flight
        return flying.run(held, hashes, i)

    def hit_tokens(self, replica: int, hashes: PageHashes, prompt_len: int) -> int:
        """Prompt tokens the replica holds or will hold; a match never covers the last one."""
        ps = self.context.page_size
        return min(self.held_pages(replica, hashes) * ps, (prompt_len - 1) // ps * ps)

    def predict(self, request: RequestInfo, hashes: PageHashes) -> list[Prediction]:
        n = request.prompt_len
        out = []
        for r in range(self.n):
            hit = self.hit_tokens(r, hashes, n)
            wait = self.prefill_time(0, self.pending[r])
            own = self.prefill_time(hit, n - hit)
            out.append(Prediction(wait + own, wait, own, hit))
        return out

    def load(self, now: float, add: float = 0.0) -> float:
        """The fleet's prefill utilisation at `now` (0 to 0.95), after adding `add` seconds of
        prefill placed then: the placed seconds decay with time constant load_window."""
        tau = self.options.load_window
        if self._busy_at is not None and now > self._busy_at:
            self._busy *= math.exp((self._busy_at - now) / tau)
        self._busy_at = now if self._busy_at is None else max(now, self._busy_at)
        self._busy += add
        return min(self._busy / (tau * self.n), 0.95)

    def locked(self, r: int) -> int:
        """KV tokens replica r cannot evict: its requests in flight, prompts and output budgets."""
        return self.inflight[r].distinct() * self.context.page_size + self.budget[r]

    def displaced(self, r: int, request: RequestInfo, hit: int, view: ReplicaView) -> int:
        """Tokens of retained prefixes that placing `request` on replica r (hit held there)
        pushes out: what it adds to the KV in flight past lock_share of the capacity (0 when
        the capacity is unknown)."""
        if not view.kv_capacity:
            return 0
        need = request.prompt_len - hit + request.max_new_tokens
        room = int(self.options.lock_share * view.kv_capacity) - self.locked(r)
        return min(need, max(0, need - room))

    def fitted_work(self, x: np.ndarray) -> float:
        """With `fit`: the prefill of features `x` at the fitted prices of its step time and
        tokens."""
        return self.fitted_prefill(x[1], x[2])

    def fitted_prefill(self, seconds: float, kilotokens: float) -> float:
        """With `fit`: prefill priced `seconds` by the step cost, of `kilotokens` thousand
        tokens, at the fitted prices of the two (features own and new)."""
        theta = self.fit.theta
        return theta[1] * seconds + theta[2] * kilotokens

    def fitted_price(self, tokens: int) -> float:
        """With `fit`: `tokens` of prefill after no cached prefix, at the fitted prices."""
        return self.fitted_prefill(self.prefill_time(0, tokens), tokens / 1000) if tokens else 0.0

    def decode_time(self, request: RequestInfo, view: ReplicaView) -> float:
        """Seconds of this request's decode in the batch it would join on that replica: its
        output budget in steps, each over every request the replica holds (running or queued)
        at about this request's context."""
        batch = view.running + view.waiting + 1
        ctx = request.prompt_len + request.max_new_tokens // 2
        return request.max_new_tokens * self.cost.step_time((), [ctx] * batch)

    def features(self, r: int, request: RequestInfo, p: Prediction, view: ReplicaView
                 ) -> np.ndarray:
        """What the fitted TTFT of `request` on replica r is regressed on (ttft_fit.FEATURES)."""
        locked = self.locked(r)
        need = request.prompt_len - p.hit_tokens + request.max_new_tokens
        over = max(0, locked + need - view.kv_capacity) / 1000 if view.kv_capacity else 0.0
        new = (request.prompt_len - p.hit_tokens) / 1000
        return np.array([p.wait, p.own, new, self.ahead[r], self.flying[r] - self.ahead[r], over,
                         1.0])

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        hashes = self.page_hashes(request)
        pred = self.predict(request, hashes)
        self._hits = (request.rid, [p.hit_tokens for p in pred])
        w, dw = self.options.work_weight, self.options.decode_weight
        dec = [self.decode_time(request, v) for v in replicas] if dw else [0.0] * self.n
        fastest = min(dec)
        lw = self.options.lock_weight
        out = [self.displaced(r, request, pred[r].hit_tokens, replicas[r]) if lw else 0
               for r in range(self.n)]
        if any(v.link_free_at for v in replicas):       # disaggregated: the KV waits its link
            pred = [p._replace(ttft=max(p.ttft, v.link_free_at - request.arrival))
                    for p, v in zip(pred, replicas)]
        w /= 1 - self.load(request.arrival)
        if self.fit is None:
            least = min(p.own for p in pred)
            self._last = (request.rid, [])
            return min(range(self.n), key=lambda r: (
                pred[r].ttft + w * (1 + replicas[r].waiting) * (pred[r].own - least)
                + dw * (dec[r] - fastest) + lw * w * self.prefill_time(0, out[r]),
                -pred[r].hit_tokens, replicas[r].queue_len, self.stored[r], r))
        xs = [self.features(r, request, pred[r], replicas[r]) for r in range(self.n)]
        ttft = [self.fit.predict(x) for x in xs]
        if any(v.link_free_at for v in replicas):
            ttft = [max(t, v.link_free_at - request.arrival) for t, v in zip(ttft, replicas)]
        work = [self.fitted_work(x) for x in xs]
        least = min(work)
        self._last = (request.rid, list(zip(xs, ttft)))
        cost = [ttft[r] + w * (1 + replicas[r].waiting) * (work[r] - least)
                + dw * (dec[r] - fastest) + lw * w * self.fitted_price(out[r])
                for r in range(self.n)]
        # a difference far inside the fit's error is no reason to load a busier replica: costs
        # within fit_tie of the least go to the shorter queue, then the fewest tokens sent (a new
        # prefix spreads, as it does in sglang-router below its match threshold)
        bound = min(cost) * (1 + self.options.fit_tie)
        return min((r for r in range(self.n) if cost[r] <= bound), key=lambda r: (
            replicas[r].queue_len, self.stored[r], cost[r], -pred[r].hit_tokens, r))

    # ---- bookkeeping --------------------------------------------------------------------------
    def on_route(self, replica: int, request: RequestInfo) -> None:
        self.check_replica(replica)
        if request.rid in self._flights:
            raise ValueError(f"request {request.rid!r} is already routed")
        last = self._last
        fresh = last is not None and last[0] == request.rid
        hashes = self.page_hashes(request)            # hashed once, by route
        hits, self._hits = self._hits, None
        hit = hits[1][replica] if hits is not None and hits[0] == request.rid \
            else self.hit_tokens(replica, hashes, request.prompt_len)
        self.inflight[replica].add(request.rid, hashes)
        new = request.prompt_len - hit
        x, said = last[1][replica] if fresh and last[1] else (None, 0.0)
        self._flights[request.rid] = Flight(replica, new, request.max_new_tokens, x, said)
        self._prefilling.add(request.rid)
        self.pending[replica] += new
        self.stored[replica] += new
        self.load(request.arrival, self.prefill_time(hit, new) if x is None
                  else self.fitted_work(x))             # placed work, at the fitted prices
        self.flying[replica] += 1
        self.ahead[replica] += 1
        self.budget[replica] += request.max_new_tokens

    def fit_quality(self):
        return None if self.fit is None else self.fit.quality()

    def on_ttft(self, replica: int, request: RequestInfo, seconds: float) -> None:
        f = self._flights.get(request.rid)
        if self.fit is not None and f is not None and f.features is not None \
                and request.rid in self._prefilling:
            self.fit.observe(f.features, seconds, f.predicted)

    def on_first_token(self, replica: int, request: RequestInfo) -> None:
        if request.rid in self._prefilling:
            self._prefilling.discard(request.rid)
            f = self._flights[request.rid]
            self.pending[f.replica] -= f.new_tokens
            self.ahead[f.replica] -= 1

    def on_events(self, replica: int, events: Events) -> None:
        self._hits = None
        super().on_events(replica, events)

    def on_finish(self, replica: int, request: RequestInfo) -> None:
        self.on_first_token(replica, request)
        f = self._flights.pop(request.rid, None)
        if f is None:
            return
        self._hits = None
        self.flying[f.replica] -= 1
        self.budget[f.replica] -= f.budget
        self.inflight[f.replica].remove(request.rid)


class RadixKVFitRouter(RadixKVRouter, name="radixkv-fit"):
    """The radixkv rule with its TTFT fitted online to the measured ones (`fit`)."""

    @classmethod
    def default_options(cls) -> RadixKVOptions:
        return RadixKVOptions(fit=True)

    @classmethod
    def check_options(cls, options) -> None:
        if isinstance(options, RadixKVOptions) and not options.fit:
            raise ValueError("router 'radixkv-fit' fits its TTFT: its options need fit=True")

    def __init__(self, context: RouterContext, options: RadixKVOptions | None = None):
        options = self.default_options() if options is None else options
        self.check_options(options)
        super().__init__(context, options)
