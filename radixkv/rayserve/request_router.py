"""A radixkv router (radixkv.router) as a Ray Serve request router, for `radixkv serve
--replicas N --router NAME` (radixkv.rayserve.ingress deploys it).

`RouterAdapter` is a Ray Serve `RequestRouter`: Ray builds one in the process that holds the
engine deployment's handle (the ingress) and calls `choose_replicas` for each request. It
builds the named router with `make_router` — the same code the cluster simulator runs — and
feeds it through the router contract: before each decision it pulls what the replicas sent to
the hub (radixkv.rayserve.replica: KV event batches → `on_events`, first outputs →
`on_first_token`, ends → `on_finish`, engine figures), then `route(request, views)` gives a
replica index, mapped to Ray's replica by the replica's rank. The chosen replica is Ray's
first rank, the others its fallback (Ray sends to a replica of a rank that has room).
`on_request_routed` tells the router (`on_route`) where the request went.

A replica that dies (Ray Serve calls `on_replica_actor_died`, or drops it from the replicas it
updates the adapter with) is forgotten at once: its pages (AllBlocksCleared on its rank), its
requests in flight (finished), its rank mapping; the hub stops listing it. Until a replacement
takes the rank, Ray Serve chooses among the live replicas. `ADAPTERS` holds the adapter of each
hub in this process, whose `state()` the ingress's `GET /replicas` reports.

A replica's view (radixkv.router.inflight) is what the front end knows at once plus what the
replica last published, as in the simulator.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from radixkv.config import EngineConfig
from radixkv.kvevents.index import KVIndex
from radixkv.kvevents.wire import AllBlocksCleared, EventBatch, KVEventBatch, decode_batch
from radixkv.rayserve.replica import hub_named
from radixkv.router import ROUTERS, RequestInfo, Router, RouterContext, make_router
from radixkv.router.inflight import InFlight
from radixkv.server.build import ServeOptions
from radixkv.sim.measured import named_cost
from radixkv.sim.specs import MODEL_SPECS

log = logging.getLogger(__name__)
PENDING_KEPT = 4096
ADAPTERS: dict[str, RouterAdapter] = {}          # hub name -> the adapter in this process


def router_kwargs(name: str, replicas: int, opts: ServeOptions, cfg: EngineConfig,
                  hub: str) -> dict:
    """The adapter's settings (JSON, as Ray Serve passes them); builds the router once here so
    a bad name or a router that cannot run on this setup fails before anything starts."""
    kwargs = {"router": name, "replicas": replicas, "page_size": cfg.cache.page_size,
              "hash_algo": cfg.cache.hash_algo, "seed": cfg.sched.seed,
              "prefill_chunk": cfg.sched.prefill_budget, "model": opts.model, "gpu": opts.gpu,
              "hub": hub}
    if name not in ROUTERS:
        raise ValueError(f"--router {name!r} is unknown; known: {', '.join(ROUTERS.names())}")
    try:
        build_router(kwargs)
    except ValueError as e:
        hint = "" if opts.model in MODEL_SPECS else \
            f" (a cost model needs --model in {', '.join(sorted(MODEL_SPECS))})"
        raise ValueError(f"--router {name!r}: {e}{hint}") from None
    return kwargs


def router_config(name: str, replicas: int, opts: ServeOptions, cfg: EngineConfig,
                  hub: str) -> tuple[RequestRouterConfig, bool]:
    """The engine deployment's RequestRouterConfig, and whether the router reads KV events."""
    kwargs = router_kwargs(name, replicas, opts, cfg, hub)
    return RequestRouterConfig(request_router_class=RouterAdapter,
                               request_router_kwargs=kwargs), ROUTERS.get(name).uses_events


def build_router(kw: dict) -> Router:
    cost = named_cost(kw["model"], kw["gpu"]) if kw["model"] in MODEL_SPECS else None
    ctx = RouterContext(kw["replicas"], kw["page_size"], kw["hash_algo"], kw["seed"], cost,
                        kw["prefill_chunk"])
    return make_router(kw["router"], ctx)


class RouterAdapter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self.setup(build_router(kwargs), kwargs["replicas"], hub_named(kwargs["hub"]))
        # Ray Serve ships this class pickled by value, with a copy of this module's globals:
        # the registry the ingress reads is the imported module's
        from radixkv.rayserve import request_router as imported
        imported.ADAPTERS[kwargs["hub"]] = self

    def setup(self, router: Router, n: int, hub) -> None:
        """The adapter's state: `router` over `n` ranks, fed from `hub`."""
        self.router, self.n, self.hub = router, n, hub
        self.cursor = 0
        self.ranks: dict[str, int] = {}                  # Ray replica id -> router index
        self.figures = [{} for _ in range(self.n)]
        self.inflight = InFlight(self.n)
        self.pending: dict[str, RequestInfo] = {}        # chosen for, not yet routed
        self.held = [KVIndex() for _ in range(self.n)]   # the pages told to the router, per rank
        self.live: set[str] = set()                      # Ray's replicas at its last update
        self.dead: set[str] = set()
        self.t0 = time.monotonic()
        self.lock = asyncio.Lock()

    # ---- what the replicas sent ---------------------------------------------------------------
    async def sync(self) -> None:
        async with self.lock:                 # one pull at a time: each entry applied once
            got = await self.hub.pull.remote(self.cursor)
            if got["lost"]:
                log.warning("the router missed %d replica notices (the hub dropped them)",
                            got["lost"])
            latest = {r["rank"]: uid for uid, r in got["replicas"].items()}   # last registered
            for uid, r in got["replicas"].items():
                if latest[r["rank"]] != uid or uid in self.dead:
                    continue                  # a replica that died (and was replaced)
                if self.ranks.get(uid) != r["rank"] and r["rank"] < self.n:
                    self.replaced(uid, r["rank"])
                if uid in self.ranks:
                    self.figures[self.ranks[uid]] = r
            for uid, kind, payload in got["items"]:
                i = self.ranks.get(uid)
                if i is None:
                    continue
                if kind == "events":
                    self.events(i, decode_batch(payload))
                elif kind == "first":
                    self.first_output(payload)
                else:
                    self.finished(payload)
            self.cursor = got["next"]

    def replaced(self, uid: str, rank: int) -> None:
        """A replica takes rank `rank` (a new one, or one that replaced a replica that died:
        the router forgets the old one's pages)."""
        gone = [u for u, r in self.ranks.items() if r == rank and u != uid]
        for u in gone:
            del self.ranks[u]
        if gone:
            self.forget(rank)
        self.ranks[uid] = rank

    def events(self, rank: int, batch: EventBatch) -> None:
        self.router.on_events(rank, batch)
        held = self.held[rank]
        held.apply(held.last_seq + 1, batch)

    def forget(self, rank: int) -> None:
        """The replica of `rank` is gone: its requests will never report (they finish) and its
        pages are forgotten."""
        for rid in self.inflight.on(rank):
            self.finished(rid)
        self.figures[rank] = {}
        self.events(rank, KVEventBatch(time.time(), [AllBlocksCleared()]))

    def died(self, uid: str) -> None:
        """Ray Serve says replica `uid` died: forgotten now, not when a replacement comes."""
        self.dead.add(uid)
        self.live.discard(uid)
        rank = self.ranks.pop(uid, None)
        if rank is None:
            return
        flying = len(self.inflight.on(rank))
        self.forget(rank)
        self.hub.dropped.remote(uid)
        log.warning("replica %s (rank %d) died: the router forgot its pages and its %d requests "
                    "in flight", uid, rank, flying)

    def state(self) -> dict:
        """What the router knows: per rank, the replica mapped there, the pages it was told
        that replica holds and its requests in flight; the replicas it saw die."""
        by_rank = {r: u for u, r in dict(self.ranks).items()}
        return {"ranks": [{"rank": r, "replica": by_rank.get(r), "pages": len(self.held[r]),
                           "in_flight": self.inflight.held[r]} for r in range(self.n)],
                "dead": sorted(list(self.dead))}

    def first_output(self, rid: str) -> None:
        got = self.inflight.first_output(rid)
        if got is not None:
            self.router.on_first_token(*got)

    def finished(self, rid: str) -> None:
        got = self.inflight.finished(rid)
        if got is not None:
            self.router.on_finish(*got)

    # ---- Ray Serve's hooks --------------------------------------------------------------------
    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.died(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Ray's replica set changed (a replica that registered with the hub but is not running
        yet is in no set: it stays)."""
        super().update_replicas(replicas)
        self.running({r.replica_id.unique_id for r in replicas})

    def running(self, live: set[str]) -> None:
        """Ray's replicas are now `live`: one live before and missing now has died."""
        for uid in self.live - live:
            self.died(uid)
        self.live = set(live)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        route = pending_request.args[0] if pending_request and pending_request.args else None
        if not route:
            return [candidate_replicas]
        await self.sync()
        by_index = {self.ranks[r.replica_id.unique_id]: r for r in candidate_replicas
                    if r.replica_id.unique_id in self.ranks}
        if len(by_index) < self.n:            # a replica not registered yet: Ray's own choice
            return [candidate_replicas]
        info = RequestInfo(route["rid"], route["tokens"], tuple(route["namespace"]),
                           route["session"], time.monotonic() - self.t0,
                           route["max_new_tokens"])
        self.pending[info.rid] = info
        while len(self.pending) > PENDING_KEPT:         # chosen for, then cancelled
            del self.pending[next(iter(self.pending))]
        try:
            chosen = by_index[self.router.route(info, self.inflight.views(self.figures))]
        except Exception:                   # a router bug must not strand the request
            log.exception("router %r failed; Ray Serve chooses this request's replica",
                          self.router.name)
            return [candidate_replicas]
        return [[chosen], [r for r in candidate_replicas if r is not chosen]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        route = pending_request.args[0] if pending_request.args else None
        info = self.pending.pop(route["rid"], None) if route else None
        i = self.ranks.get(replica_id.unique_id)
        if info is None or i is None:
            return
        self.router.on_route(i, info)
        self.inflight.sent(i, info)
