"""NVIDIA Dynamo's KV router (`--router-mode kv`, lib/llm/src/kv_router: scheduler.rs'
DefaultWorkerSelector over sequence.rs' ActiveSequences; docs/router/README.md "Cost Function").

Per worker w, with bs the KV block size (the replicas' page size), isl the prompt's tokens and
overlap(w) the prompt's leading whole blocks w holds (from its KV events):

  potential_prefill_blocks(w) = (isl - bs * overlap(w) + pending_prefill_tokens(w)) / bs
  potential_active_blocks(w)  = |active(w)| + |blocks(request) - active(w)|
  logit(w) = overlap_score_weight * potential_prefill_blocks(w) + potential_active_blocks(w)

pending_prefill_tokens(w) sums, over the requests routed to w whose first token has not come
back, their isl - bs * overlap at routing; active(w) is the set of distinct block hashes of the
requests routed to w and not finished (Dynamo's default router_assume_kv_reuse: a block that
several of them share counts once; output blocks are not tracked, its default too). The router
keeps both itself: on_route adds, on_first_token ends the pending prefill, on_finish removes
(and ends the prefill if no first token was reported).

With router_temperature 0 (the default) the lowest logit wins; ties go to one of the tied
workers at random (Dynamo draws uniformly among them), here from the router's seeded generator
so a run is reproducible. With a temperature T > 0 the worker is sampled from
softmax(-logit / ((max - min) * T)) (uniform when all logits are equal), as Dynamo's
softmax_sample does, with the same seeded generator. Defaults are Dynamo's KvRouterConfig:
overlap_score_weight 1.0, router_temperature 0.0.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from radixkv.router.base import ReplicaView, RequestInfo, RouterContext
from radixkv.router.llmd import EventRouter
from radixkv.argcheck import finite_at_least


@dataclass(frozen=True)
class DynamoOptions:
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0

    def __post_init__(self):
        for name in ("overlap_score_weight", "router_temperature"):
            finite_at_least(getattr(self, name), f"dynamo-kv {name}", 0)


@dataclass(frozen=True, slots=True)
class Flight:
    """A request routed and not finished: its replica, block hashes and prefill tokens."""
    replica: int
    hashes: tuple[int, ...]
    prefill_tokens: int


def softmax_sample(logits: Sequence[float], temperature: float, u: float) -> int:
    """Dynamo's softmax_sample for temperature > 0: lower logits likelier; `u` in [0, 1)."""
    lo, hi = min(logits), max(logits)
    if hi == lo:
        probs = [1.0 / len(logits)] * len(logits)
    else:
        scaled = [-v / (hi - lo) / temperature for v in logits]
        top = max(scaled)
        exps = [math.exp(s - top) for s in scaled]
        total = sum(exps)
        probs = [e / total for e in exps]
    cum = 0.0
    for i, p in enumerate(probs):
        cum += p
        if u <= cum:
            return i
    return len(logits) - 1


class DynamoKV(EventRouter, name="dynamo-kv"):
    Options = DynamoOptions

    def __init__(self, context: RouterContext, options: DynamoOptions | None = None):
        super().__init__(context, options)
        self.rng = random.Random(context.seed)
        self.active: list[dict[int, int]] = [{} for _ in range(self.n)]   # hash -> requests
        self.pending = [0] * self.n           # prefill tokens of requests with no first token
        self._flights: dict[str, Flight] = {}
        self._prefilling: set[str] = set()

    def overlap(self, replica: int, hashes: Sequence[int]) -> int:
        """The request's leading blocks `replica` holds, as its events show."""
        return self.index.indexes[replica].prefix_match(hashes)

    def new_tokens(self, request: RequestInfo, overlap: int) -> int:
        return max(request.prompt_len - overlap * self.context.page_size, 0)

    def logits(self, request: RequestInfo) -> list[float]:
        """Each replica's cost (lower is better) for `request`."""
        hashes = self.page_hashes(request)
        bs, w = self.context.page_size, self.options.overlap_score_weight
        out = []
        for r in range(self.n):
            prefill = (self.new_tokens(request, self.overlap(r, hashes)) + self.pending[r]) / bs
            active = self.active[r]
            decode = len(active) + sum(1 for h in hashes if h not in active)
            out.append(w * prefill + decode)
        return out

    def route(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> int:
        self.check_views(replicas)
        logits = self.logits(request)
        t = self.options.router_temperature
        if t > 0:
            return softmax_sample(logits, t, self.rng.random())
        best = min(logits)
        tied = [r for r, v in enumerate(logits) if v == best]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    # ---- bookkeeping --------------------------------------------------------------------------
    def on_route(self, replica: int, request: RequestInfo) -> None:
        self.check_replica(replica)
        if request.rid in self._flights:
            raise ValueError(f"request {request.rid!r} is already routed")
        hashes = self.page_hashes(request)
        new = self.new_tokens(request, self.overlap(replica, hashes))
        active = self.active[replica]
        for h in hashes:
            active[h] = active.get(h, 0) + 1
        self._flights[request.rid] = Flight(replica, tuple(hashes), new)
        self._prefilling.add(request.rid)
        self.pending[replica] += new

    def on_first_token(self, replica: int, request: RequestInfo) -> None:
        if request.rid in self._prefilling:
            self._prefilling.discard(request.rid)
            f = self._flights[request.rid]
            self.pending[f.replica] -= f.prefill_tokens

    def on_finish(self, replica: int, request: RequestInfo) -> None:
        self.on_first_token(replica, request)
        f = self._flights.pop(request.rid, None)
        if f is None:                         # never routed here (Dynamo warns and ignores)
            return
        active = self.active[f.replica]
        for h in f.hashes:
            left = active[h] - 1
            if left:
                active[h] = left
            else:
                del active[h]
